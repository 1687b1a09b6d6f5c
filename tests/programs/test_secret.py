"""Secrets read from files (secret.py) and the hub fetch's token: a link, a directory, a pipe, two
lines, an oversize or empty file are refused with words that never hold the file's text; the token
goes to an http:// hub only when allowed; a library's error that holds it is printed masked."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dual_spark.secret import SecretError, masked, read_secret

from tests.programs import ARCHIVE

TOKEN = "hf_AbC123secret"
# huggingface_hub as fetch uses it (not installed here): it notes each call's token in $STUB_LOG
# and fails where $STUB_FAIL says with the token in its words, as a library's error might.
STUB = '''
import os
from types import SimpleNamespace


def note(call, token):
    with open(os.environ["STUB_LOG"], "a") as log:
        log.write(f"{call} {token!r}\\n")


class HfApi:
    def __init__(self, endpoint=None):
        self.endpoint = endpoint

    def model_info(self, repo, revision, files_metadata, token):
        note("model_info", token)
        if os.environ["STUB_FAIL"] == "model_info":
            raise TypeError(f"bad header: Authorization: Bearer {token}")
        return SimpleNamespace(sha="c" * 40, siblings=[SimpleNamespace(rfilename="config.json", size=2, lfs=None)])


def hf_hub_download(repo, name, revision, local_dir, token):
    note("download", token)
    raise RuntimeError(f"xet refresh failed for token {token}")
'''
ERRORS = "".join(f"class {name}(Exception):\n    pass\n\n\n" for name in
                 ("GatedRepoError", "HfHubHTTPError", "RepositoryNotFoundError", "RevisionNotFoundError"))


def token_file(tmp_path: Path, text: str = TOKEN + "\n") -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(SecretError) as refused:
        read_secret(path, "the hub token file", "Fix: put the token alone there.")
    return str(refused.value)


def test_a_token_alone_on_its_line_is_read(tmp_path):
    assert read_secret(token_file(tmp_path), "the hub token file", "") == TOKEN
    assert read_secret(token_file(tmp_path, TOKEN), "the hub token file", "") == TOKEN  # no newline (hf auth login)


def test_a_link_to_a_good_token_is_refused_without_following_it(tmp_path):
    target = token_file(tmp_path)
    (tmp_path / "link").symlink_to(target)
    message = refusal(tmp_path / "link")
    assert message == f"the hub token file {tmp_path / 'link'} is a symbolic link. Fix: put the token alone there."


def test_a_directory_and_a_pipe_are_refused(tmp_path):
    assert "is a directory, not a regular file" in refusal(tmp_path)
    os.mkfifo(tmp_path / "pipe")
    assert "is a pipe, not a regular file" in refusal(tmp_path / "pipe")  # refused at once, not waited on


@pytest.mark.parametrize("text", [f"{TOKEN}\n{TOKEN}\n", f"{TOKEN}\n\n", f"{TOKEN} {TOKEN}\n", f"{TOKEN}\r\n", "\n", "",
                                  f"{TOKEN}é\n"])
def test_anything_but_one_line_of_token_characters_is_refused_unseen(tmp_path, text):
    message = refusal(token_file(tmp_path, text))
    assert "does not hold exactly one line of printable ASCII without spaces" in message and TOKEN not in message


def test_an_oversize_file_is_refused_unseen(tmp_path):
    message = refusal(token_file(tmp_path, TOKEN * 300))
    assert "holds more than 4096 bytes" in message and TOKEN not in message


def test_masked_replaces_every_copy():
    assert masked(f"a {TOKEN} b {TOKEN}", TOKEN) == "a *** b ***"
    assert masked("no secret", None) == "no secret"


def fetch(tmp_path: Path, fail: str, endpoint: str, *more: str) -> tuple[subprocess.CompletedProcess, str]:
    """The fetch program, as shipped, over the stub hub: its result and what the stub was sent."""
    stub = tmp_path / "stub" / "huggingface_hub"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text(STUB)
    (stub / "errors.py").write_text(ERRORS)
    log = tmp_path / "calls"
    env = {**os.environ, "PYTHONPATH": str(stub.parent), "STUB_LOG": str(log), "STUB_FAIL": fail, "HF_ENDPOINT": endpoint}
    result = subprocess.run([sys.executable, str(ARCHIVE), "fetch", "--repo", "org/tiny", "--revision", "c" * 40,
                             "--dest", str(tmp_path / "model"), "--store", str(tmp_path), *more],
                            env=env, capture_output=True, text=True, timeout=30)
    return result, log.read_text() if log.exists() else ""


@pytest.mark.parametrize("fail", ["model_info", "download"])
def test_a_library_error_holding_the_token_is_printed_masked(tmp_path, fail):
    result, calls = fetch(tmp_path, fail, "https://hub.example", "--token-file", str(token_file(tmp_path)))
    assert repr(TOKEN) in calls  # the hub was sent the token, and its error held it
    assert result.returncode == 1 and "fetch_model: " in result.stderr and "***" in result.stderr
    assert TOKEN not in result.stdout + result.stderr and "Traceback" not in result.stderr


def test_a_refused_token_file_stops_the_fetch_before_the_hub(tmp_path):
    (tmp_path / "link").symlink_to(token_file(tmp_path))
    result, calls = fetch(tmp_path, "", "https://hub.example", "--token-file", str(tmp_path / "link"))
    assert result.returncode == 1 and calls == ""
    assert result.stderr == f"fetch_model: the hub token file {tmp_path / 'link'} is a symbolic link. Fix: as the deploy " \
                            "user, put the token alone in the file hf_token_file names (mode 600), e.g. with `hf auth " \
                            "login`, or remove the file if the repository is public\n"


def test_the_token_goes_to_an_http_hub_only_when_allowed(tmp_path):
    token = str(token_file(tmp_path))
    refused, calls = fetch(tmp_path, "model_info", "http://hub.lan", "--token-file", token)
    assert refused.returncode == 1 and calls == ""
    assert "HF_ENDPOINT http://hub.lan is not https://" in refused.stderr and "hf_endpoint_insecure_http" in refused.stderr
    allowed, calls = fetch(tmp_path, "model_info", "http://hub.lan", "--token-file", token, "--allow-http-token")
    assert calls == f"model_info {TOKEN!r}\n" and TOKEN not in allowed.stderr


def test_without_a_token_file_none_is_sent_even_to_an_http_hub(tmp_path):
    result, calls = fetch(tmp_path, "model_info", "http://hub.lan", "--token-file", str(tmp_path / "absent"))
    assert calls == "model_info False\n"  # huggingface_hub would otherwise send one it finds itself
    assert "fetch_model: TypeError: bad header: Authorization: Bearer False" in result.stderr
