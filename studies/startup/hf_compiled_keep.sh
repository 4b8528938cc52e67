#!/usr/bin/env bash
# hf_compiled_keep.py's three settings, alternated, ROUNDS rounds, each a process, on a new cache folder; alone
ROUNDS=${ROUNDS:-2} CACHE=${CACHE:-/tmp/peer_keep_cache}
cd "$(dirname "$0")/../.."
lscpu | grep -E "Model name|CPU family|^Model:"
rm -rf "$CACHE" && mkdir -p "$CACHE" && ln -s "$HOME/.cache/skipsearch/models" "$CACHE/models"
for round in $(seq 1 "$ROUNDS"); do
  for v in kernel freezing defaults; do
    SKIPSEARCH_CACHE=$CACHE .venv/bin/python studies/startup/hf_compiled_keep.py $v 2>&1 | grep -E "^$v:"
  done
done
