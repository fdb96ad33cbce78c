#!/usr/bin/env bash
# .whl/ for a GPU machine with Python 3.12 and torch/lightning but no ray, pydantic or internet (the device
# machine in BENCHMARKS.md "GPU check"): cp312 manylinux wheels, and ray as ray-VERSION-slim.tar.xz, since its
# 79 MB wheel alone is more than a 64 MiB transfer. The slim copy drops what fedsim never imports: Java jars,
# RLlib, LLM, Serve, Tune, Train and the dashboard's web client. benchmarks/gpu_check.sh unpacks both.
# Run from the repository root; pip needs a package index. Add /.whl/ to .git/info/exclude.
set -euo pipefail
RAY=2.60.0
PKGS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing_extensions==4.16.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
  rpds-py==2026.9.1"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
fetch() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS "$@"; }
mkdir -p .whl
# shellcheck disable=SC2086  # the lists are meant to split
fetch -d .whl $PKGS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fetch -d "$work" "ray==$RAY"
mkdir "$work/site"
(cd "$work/site" && unzip -q "$work"/ray-*.whl &&
  rm -rf ray/jars ray/rllib ray/llm ray/serve ray/tune ray/train ray/dashboard/client)
tar -C "$work/site" -cf - . | xz -6 -T0 > ".whl/ray-$RAY-slim.tar.xz"
du -sh .whl
