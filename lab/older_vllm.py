"""The older runtime image's sitecustomize.py: the lab's one CPU vLLM (0.32, which has dynamic
speculation) read as a vLLM that predates it. Once vllm.config.speculative has run, its
SpeculativeConfig loses the fields num_speculative_tokens_per_batch_size and
enable_adaptive_verification from its dataclass fields, which is what the deploy's smoke test
reads (files/dual_spark/smoke.py SMOKE): the deploy's refusal of a profile key an image lacks is then
proven against a real image. A profile that asks for neither is served from it as from any image
(tests/e2e/test_42_image_support.py switches to it and back through the front door)."""

import importlib.abc
import importlib.machinery
import sys

MODULE = "vllm.config.speculative"
NEWER_FIELDS = ("num_speculative_tokens_per_batch_size", "enable_adaptive_verification")


class WithoutDynamicSpeculation(importlib.abc.MetaPathFinder):
    """Finds vllm.config.speculative as Python would, and drops the newer fields once it has run."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for field in NEWER_FIELDS:
                module.SpeculativeConfig.__dataclass_fields__.pop(field, None)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, WithoutDynamicSpeculation())
