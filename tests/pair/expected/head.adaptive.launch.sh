#!/bin/sh
# Managed by the dual-spark deploy (tasks/serving.py): edits here are overwritten.
# The head's vLLM, profile adaptive: shipped as a file and exec'd, so no argument is
# quoted through nested shells (the --speculative-config JSON survives as written). Beside it runs
# the watchdog (watchdog.py, sha256 <what the watchdog runs, programs.digest>...), which ends vLLM when this side can
# no longer serve: Docker then restarts the container, with a backoff when it keeps failing to come up.
set -eu
watchdog() { /opt/env/bin/python /dual-spark/dual-spark.pyz watchdog "$@"; }
watchdog backoff --state /dual-spark/state/head-starts --container-starts /var/tmp/dual-spark-container-starts
# The API key reaches vLLM by its environment (VLLM_API_KEY), not its command line, where any
# user of the host could read it in the process list.
VLLM_API_KEY="$(cat /run/secrets/dual-spark-api-key)"
export VLLM_API_KEY
watchdog head --ip 10.10.0.1 --port 25001 --url http://127.0.0.1:8889 \
  --key-file /run/secrets/dual-spark-api-key --pid $$ --startup-timeout 1800 --state /dual-spark/state/head-starts \
  --worker-ip 10.10.0.2 &
watchdog wait-for-worker --worker-ip 10.10.0.2 --port 25001 --timeout 600
exec /opt/env/bin/vllm \
  serve \
  /model \
  --served-model-name deepseek-v4-flash \
  --host 127.0.0.1 \
  --port 8889 \
  --trust-remote-code \
  --tensor-parallel-size 2 \
  --pipeline-parallel-size 1 \
  --kv-cache-dtype fp8 \
  --block-size 256 \
  --max-model-len 900000 \
  --max-num-seqs 4 \
  --max-num-batched-tokens 8192 \
  --gpu-memory-utilization 0.8 \
  --enable-prefix-caching \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5,"prompt_lookup_max":3}' \
  --tokenizer-mode deepseek_v4 \
  --distributed-executor-backend mp \
  --tool-call-parser deepseek_v4 \
  --enable-auto-tool-choice \
  --reasoning-parser deepseek_v4 \
  --default-chat-template-kwargs '{"thinking":false}' \
  --generation-config vllm \
  --override-generation-config '{"temperature":0.0,"top_p":1.0}' \
  --enable-flashinfer-autotune \
  --nnodes 2 \
  --node-rank 0 \
  --master-addr 10.10.0.1 \
  --master-port 25000 \
  --enable-chunked-prefill
