#!/usr/bin/env bash
# Every source path that the public headers, the docs and the README name (src/..., tests/...,
# scripts/..., benchmarks/..., examples/...) exists: a file moved without its mentions fails here.
# Usage: bash scripts/check-doc-paths.sh [REPOSITORY_ROOT]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
missing=0
while IFS= read -r hit; do
  file=${hit%%:*}
  path=${hit#*:}
  if [ ! -e "$path" ]; then
    echo "$file names $path, which does not exist" >&2
    missing=$((missing + 1))
  fi
done < <(grep -oE '(src|tests|scripts|benchmarks|examples)/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.(cpp|hpp|h|sh|py|toml|md|cmake)' \
           -r include docs README.md | sort -u)
if [ "$missing" -gt 0 ]; then
  echo "check-doc-paths: $missing path(s) named but missing" >&2
  exit 1
fi
echo "check-doc-paths: every named path exists"
