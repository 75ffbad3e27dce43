#!/usr/bin/env bash
# One GPU, one call: the measurement harness's GPU paths against meshplan's prediction (docs/measure-and-crosscheck.md,
# "Measured on a GPU"). Run from the repository root with torch installed:
#
#     bash benchmarks/gpu_check.sh OUTDIR [CLUSTER] [PARTS]
#
# PARTS (default "kernels seqs steps"): kernels = the GEMM sweep and the GEMM and attention shapes of
# three plans; seqs = Llama-3-8B's attention at 1K to 16K tokens; steps = four single-GPU training
# steps (FSDP2 over one rank: BF16 compute on FP32 parameters and AdamW states). Each is compared
# with meshplan's prediction for CLUSTER (default h200). About three minutes on an H200.
# GPU_CHECK_CPU=1 runs the same commands on the CPU with the scaled-down models (a dry run).
set -u
out=${1:?usage: gpu_check.sh OUTDIR [CLUSTER]}
cluster=${2:-h200}
parts=${3:-kernels seqs steps}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
run() { echo "+ meshplan $*"; timeout 240 bash -c 'python3 -c "import sys; from meshplan.cli import main; sys.exit(main(sys.argv[1:]))" "$@"' _ "$@" || echo "(exit $?)"; }

if [ "${GPU_CHECK_CPU:-0}" = 1 ]; then
    common=(--nproc 1 --backend gloo --scale-down); seq=(--seq-len 128); s=128; big=llama-3.2-3b
else
    common=(--nproc 1 --backend nccl); seq=(--seq-len 4096); s=4096; big=llama-3-8b
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
        --format=csv
fi
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
            torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'

# kernels: the square/skinny sweep, then the shapes of three plans (merged into one profile)
if [[ $parts == *kernels* ]]; then
run measure gemm "${common[@]}" --cluster "$cluster" --out "$out/kernels.json"
run measure gemm "${common[@]}" "${seq[@]}" --cluster "$cluster" --model seed-70b --plan tp=8,mbs=1 \
    --out "$out/kernels.json"
run measure gemm "${common[@]}" "${seq[@]}" --cluster "$cluster" --model llama-3-8b --plan tp=1,mbs=1 \
    --out "$out/kernels.json"
run measure gemm "${common[@]}" "${seq[@]}" --cluster "$cluster" --model llama-3.2-3b --plan tp=1,mbs=2 \
    --out "$out/kernels.json"
fi
if [[ $parts == *seqs* ]]; then
    for len in $((s / 4)) $((s / 2)) $((2 * s)) $((4 * s)); do
        run measure gemm "${common[@]}" --seq-len $len --cluster "$cluster" --model llama-3-8b \
            --plan tp=1,mbs=1 --out "$out/kernels.json"
    done
fi

# training steps on one GPU, each against the prediction
if [[ $parts == *steps* ]]; then
run measure step "${common[@]}" "${seq[@]}" --cluster "$cluster" --model llama-3.2-3b \
    --plan dp_shard=1,mbs=2,recompute=none --batch-tokens $((2 * s)) --compare --out "$out/step_3b_mbs2.json"
run measure step "${common[@]}" "${seq[@]}" --cluster "$cluster" --model llama-3.2-3b \
    --plan dp_shard=1,mbs=1,recompute=none --batch-tokens $((4 * s)) --compare --out "$out/step_3b_acc4.json"
run measure step "${common[@]}" "${seq[@]}" --cluster "$cluster" --model llama-3.2-3b \
    --plan dp_shard=1,mbs=4,recompute=full --batch-tokens $((4 * s)) --compare --out "$out/step_3b_mbs4_full.json"
run measure step "${common[@]}" "${seq[@]}" --cluster "$cluster" --model "$big" \
    --plan dp_shard=1,mbs=1,recompute=full --batch-tokens $((2 * s)) --compare --out "$out/step_8b_full.json"
fi

run measure compare --profile "$out/kernels.json" --cluster "$cluster"
