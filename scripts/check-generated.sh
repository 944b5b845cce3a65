#!/usr/bin/env bash
# Regenerate the bpf2go output and fail if the committed copy is stale.
#
# The generated *_bpfel.go / *_bpfel.o files are committed so that `go build`
# needs no clang. This check (modelled on pwru's) reruns `go generate ./...`
# and then asks git whether any generated file differs from what is committed.
#
# Two failure cases:
#   * regeneration changed a generated file: it was stale (someone edited bpf/
#     or the //go:generate line without regenerating);
#   * a generated file is modified/untracked/deleted relative to git, i.e. not
#     committed as it must be. This one only fails when CI is set (CI=true, as
#     in .ci/run) or STRICT=1; in a working tree with uncommitted work it is a
#     warning, so `make test` can be run before committing.
#
# Usage: scripts/check-generated.sh   (from the Makefile: make check-generated)
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
strict=false
[[ ${CI:-} == true || ${CI:-} == 1 || ${STRICT:-} == 1 ]] && strict=true

# bpf2go output: <stem>_bpfel.{go,o}, <stem>_bpfeb.{go,o} and arch-specific
# variants such as <stem>_x86_bpfel.go.
patterns=('*_bpfel.go' '*_bpfel.o' '*_bpfeb.go' '*_bpfeb.o')

generated() {
	local args=() p
	for p in "${patterns[@]}"; do args+=(${args:+-o} -name "$p"); done
	find . -path ./.git -prune -o \( "${args[@]}" \) -type f -print0 2>/dev/null | sort -z | xargs -0 -r -n1 echo
}

# identity is what must not change for a generated file to be up to date:
# a Go file's bytes, an object's instructions, relocations and symbols.
# clang-16 orders an object's BTF types differently depending on the path
# of the checkout (integrations/mcctl's tracker, same instructions), so its
# bytes may differ in a fresh clone; a comment's change (line info) is
# not caught either.
identity() {
	case $1 in
	*.o) llvm-objdump-16 -d -r -t --no-show-raw-insn "$1" | sed '/file format/d' ;;
	*) cat "$1" ;;
	esac | sha256sum | cut -d' ' -f1
}

snapshot() {
	local f
	generated | while read -r f; do echo "$(identity "$f")  $f"; done
}

before=$(snapshot)
if ! "$GO" generate ./...; then
	echo "check-generated: 'go generate ./...' failed (see above; a missing compiler is fixed by 'make deps')" >&2
	exit 1
fi
after=$(snapshot)

if [[ $before != "$after" ]]; then
	echo "check-generated: the generated bpf2go files were stale; 'go generate ./...' changed:" >&2
	diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") | sed -n 's/^[<>] [0-9a-f]*  /  /p' | sort -u >&2
	echo "check-generated: run 'make generate' and commit the result." >&2
	exit 1
fi

git_() { git -c safe.directory="$PWD" "$@"; }
if ! git_ rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	echo "check-generated: not a git work tree; skipped the committed-state check" >&2
	exit 0
fi

# objects that regenerated with the committed identity but other bytes:
# the committed ones stand
committed=$(mktemp --suffix=.o)
trap 'rm -f "$committed"' EXIT
while read -r f; do
	git_ show "HEAD:$f" >"$committed" 2>/dev/null || continue
	if [[ $(identity "$f") == $(identity "$committed") ]]; then
		git_ checkout -q -- "$f"
	fi
done < <(git_ diff --name-only -- '*_bpfel.o' '*_bpfeb.o')

status=$(git_ status --porcelain --untracked-files=all -- "${patterns[@]}")
if [[ -n $status ]]; then
	if $strict; then
		echo "check-generated: generated files differ from the committed ones:" >&2
		printf '%s\n' "$status" >&2
		git_ --no-pager diff --stat -- "${patterns[@]}" >&2 || true
		echo "check-generated: run 'make generate' and commit the generated files." >&2
		exit 1
	fi
	echo "check-generated: warning: generated files are up to date but not committed (fails under CI=true):" >&2
	printf '%s\n' "$status" >&2
fi
