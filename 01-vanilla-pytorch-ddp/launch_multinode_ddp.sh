#!/usr/bin/env bash
# Launch train_ddp.py over several machines with torchrun. Run it once on every node, with the same
# arguments except --node-rank. Node 0's address is the rendezvous endpoint; the others must reach it.
#
#   usage: launch_multinode_ddp.sh --nnodes N --node-rank R --endpoint HOST:PORT [--nproc-per-node P] [-- TRAIN_FLAGS]
#
#   on node 0:  bash 01-vanilla-pytorch-ddp/launch_multinode_ddp.sh --nnodes 2 --node-rank 0 \
#                   --endpoint 10.0.0.1:29500 -- --model small --data-dir /shared/cifar10
#   on node 1:  bash 01-vanilla-pytorch-ddp/launch_multinode_ddp.sh --nnodes 2 --node-rank 1 \
#                   --endpoint 10.0.0.1:29500 -- --model small --data-dir /shared/cifar10
#
# --nproc-per-node defaults to the node's GPU count (1 on a CPU-only node). --data-dir and
# --checkpoint-dir should be on storage every node sees: rank 0 writes the checkpoint, all ranks read it.
set -euo pipefail

usage() { sed -n 's/^# \{0,1\}//; 2,/^set /p' "$0" | sed '$d'; }
fail() { echo "error: $1" >&2; usage >&2; exit 2; }

nnodes="" node_rank="" endpoint="" nproc=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nnodes) nnodes="$2"; shift 2 ;;
    --node-rank) node_rank="$2"; shift 2 ;;
    --endpoint) endpoint="$2"; shift 2 ;;
    --nproc-per-node) nproc="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) fail "unknown option $1 (training flags go after --)" ;;
  esac
done
[[ -n "$nnodes" && -n "$node_rank" && -n "$endpoint" ]] || fail "--nnodes, --node-rank and --endpoint are required"
[[ "$endpoint" == *:* ]] || fail "--endpoint must be HOST:PORT, got $endpoint"
nproc="${nproc:-$(python -c 'import torch; print(torch.cuda.device_count() or 1)')}"

exec torchrun --nnodes="$nnodes" --node-rank="$node_rank" --nproc-per-node="$nproc" \
  --master-addr="${endpoint%:*}" --master-port="${endpoint##*:}" \
  "$(dirname "$0")/train_ddp.py" "$@"
