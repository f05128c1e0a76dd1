#!/usr/bin/env bash
# One command for a machine with a CUDA GPU: build the tiny (and a ~400 M) Gemma 4 for
# --target cuda in f16 and bf16 (and int4 when `mobius build` has --quant), compare each
# with the CPU f32 package (top-1, max|Δ|), run the tiny golden cases on CUDA, and
# measure decode tokens/s against the GPU's memory-bandwidth limit. Everything goes to
# one report file. On a machine without a CUDA GPU it says so and exits 0.
#
# Usage: scripts/device_check.sh [--out REPORT] [--work DIR] [--no-mid] [--no-golden]
#                                [--python PY] [--budget SECONDS] [-h|--help]
#   --out REPORT    report file (default: ./device-check-<UTC time>.txt; never overwritten)
#   --work DIR      where checkpoints and packages go (default: a new temporary folder,
#                   removed at the end); an existing DIR must be empty
#   --no-mid        only the bundled tiny checkpoint (the mid one needs torch + transformers)
#   --no-golden     skip `tox -e golden -- --device cuda` on the tiny cases
#   --python PY     the interpreter with mobius installed (default: python3 on PATH)
#   --budget S      stop starting new steps after S seconds (default 540: under 10 minutes)
# Exit status: 0 when every check ran and passed (or no GPU is present), 1 when a check
# failed, 2 for bad arguments.
set -uo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
die_usage() { echo "device_check: $1" >&2; echo "run with --help for the options" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
out=""
work=""
mid=1
golden=1
python="${PYTHON:-python3}"
budget=540
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --out) [ $# -ge 2 ] || die_usage "--out needs a file name"; out="$2"; shift 2 ;;
        --work) [ $# -ge 2 ] || die_usage "--work needs a folder"; work="$2"; shift 2 ;;
        --no-mid) mid=0; shift ;;
        --no-golden) golden=0; shift ;;
        --python) [ $# -ge 2 ] || die_usage "--python needs an interpreter"; python="$2"; shift 2 ;;
        --budget)
            [ $# -ge 2 ] || die_usage "--budget needs a number of seconds"
            case "$2" in ''|*[!0-9]*) die_usage "--budget must be whole seconds, got '$2'" ;; esac
            budget="$2"; shift 2 ;;
        *) die_usage "unknown argument '$1'" ;;
    esac
done
[ -n "$out" ] || out="$PWD/device-check-$(date -u +%Y%m%dT%H%M%SZ).txt"
if [ -e "$out" ] || [ -L "$out" ]; then
    die_usage "report file $out exists; pass another --out (nothing is overwritten)"
fi
if [ -n "$work" ] && [ -e "$work" ] && [ -n "$(ls -A "$work" 2>/dev/null)" ]; then
    die_usage "work folder $work is not empty; pass an empty or new folder"
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "device_check: no CUDA GPU on this machine (nvidia-smi finds none); nothing to check."
    exit 0
fi
if ! command -v "$python" >/dev/null 2>&1; then
    die_usage "python interpreter '$python' not found; pass --python"
fi

made_work=0
if [ -z "$work" ]; then
    work="$(mktemp -d "${TMPDIR:-/tmp}/mobius-device-check.XXXXXX")"
    made_work=1
fi
mkdir -p "$work"
cleanup() { if [ "$made_work" = 1 ]; then rm -rf -- "$work"; fi; }
trap cleanup EXIT

checks() {
    local start status elapsed
    start=$(date +%s)
    echo "mobius device check — $(date -u '+%Y-%m-%d %H:%M:%S UTC'), repository $root"
    echo "report: $out; work folder: $work"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    status=0
    local args=(--work "$work" --budget "$budget" --started "$start")
    [ "$mid" = 1 ] || args+=(--no-mid)
    if ! PYTHONPATH="$root/mobius-core/src:$root/mobius-gemma4/src:$root/mobius-runtime/src:$root/mobius-testing/src${PYTHONPATH:+:$PYTHONPATH}" \
        "$python" "$here/device_check.py" "${args[@]}"; then
        status=1
    fi
    if [ "$golden" = 1 ]; then
        elapsed=$(( $(date +%s) - start ))
        if [ "$elapsed" -ge "$budget" ]; then
            echo "golden: SKIPPED, the ${budget} s budget is spent (${elapsed} s)"
        elif ! command -v tox >/dev/null 2>&1; then
            echo "golden: SKIPPED, tox is not installed (pip install tox)"
            status=1
        else
            echo "== tox -e golden -- --device cuda -k tiny"
            if ! (cd "$root" && timeout $(( budget - elapsed + 60 )) tox -e golden -- --device cuda -k tiny); then
                echo "golden: FAILED"
                status=1
            fi
        fi
    fi
    echo "device check finished in $(( $(date +%s) - start )) s: $([ "$status" = 0 ] && echo OK || echo FAILED)"
    return "$status"
}

: > "$out" || die_usage "cannot write the report file $out"
checks 2>&1 | tee -a "$out"
exit "${PIPESTATUS[0]}"
