#!/usr/bin/env bash
# cold then warm decode of the shipped profile, old tree then new tree; nothing else runs
P=profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml
run() { # tree tag
  if [ "$1" = old ]; then root=/tmp/old; else root=/work/main; fi
  cd $root
  /usr/bin/time -f "$2 wall %e s" env PYTHONPATH=$root /work/main/.venv/bin/python -m skipsearch decode --profile $P \
     --prompt "def fib(n):" --max-new-tokens 96 --check > /tmp/ab/$2.out 2> /tmp/ab/$2.err
  grep -v "it/s\]" /tmp/ab/$2.err | grep -E "compil|loading|check|wall|tok/s" >> /tmp/ab/startup.log
}
: > /tmp/ab/startup.log
lscpu | grep -E "Model name|CPU family|^Model:" >> /tmp/ab/startup.log
rm -rf ~/.cache/skipsearch/inductor ~/.cache/skipsearch/graphs
run old old-cold; run old old-warm; run new new-cold; run new new-warm
