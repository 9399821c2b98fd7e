#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: run the shipped example (examples/gpu-train) as one node of the
# reference's mpirun line, one rank per GPU, with NCCL_DEBUG=INFO, and keep the real NCCL log; then
# read it with the console's NCCL parser. Builds nothing large: it uses the machine's own PyTorch and
# Open MPI (pip installs torch and mpi4py only when they are missing).
# Usage: bench/gpu-check.sh [OUTPUT_DIR]   (default: $OUT, else ./gpu-check-output)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check-output}}
mkdir -p "$out"

command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this machine has no NVIDIA GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpus.txt"
gpus=$(wc -l < "$out/gpus.txt")
python=${PYTHON:-python3}
"$python" -c 'import torch, mpi4py' 2>/dev/null || "$python" -m pip install -q torch mpi4py
"$python" -c 'import torch; assert torch.cuda.is_available(), "PyTorch sees no GPU"; print("torch", torch.__version__, "CUDA", torch.version.cuda)' | tee "$out/torch.txt"

echo "$(hostname) slots=$gpus" > "$out/hostfile"
: > "$out/tune-env"
set +e
# The reference's command with its defaults; the interface list as the platform sets it.
mpirun --allow-run-as-root -np "$gpus" -hostfile "$out/hostfile" -tune "$out/tune-env" \
    -bind-to none -map-by slot \
    -x LD_LIBRARY_PATH -x HOROVOD_MPI_THREADS_DISABLE=1 -x NCCL_DEBUG=INFO \
    -x NCCL_SOCKET_IFNAME=ib0,bond0,eth0 -x NCCL_SOCKET_FAMILY=AF_INET -x NCCL_IB_DISABLE=0 \
    -mca pml ob1 -mca btl ^openib -mca plm_rsh_no_tree_spawn true --tag-output \
    "$python" examples/gpu-train/train.py --steps=20 > "$out/nccl.log" 2>&1
status=$?
set -e
echo "mpirun exit code: $status" | tee "$out/exit-code.txt"
grep -c "NCCL INFO" "$out/nccl.log" | sed 's/^/NCCL INFO lines: /'
"$python" -m nccl "$out/nccl.log" | tee "$out/nccl-summary.txt"
"$python" -m nccl --json "$out/nccl.log" > "$out/nccl-summary.json"
exit "$status"
