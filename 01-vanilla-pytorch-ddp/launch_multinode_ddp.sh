#!/usr/bin/env bash
# Launch train_ddp.py over several machines with torchrun. Run it once on every node, with the same
# arguments. The endpoint is a HOST:PORT that every node reaches (node 0's, say): torchrun's c10d
# rendezvous keeps its store there, and numbers the ranks as the nodes join.
#
#   usage: launch_multinode_ddp.sh --nnodes N|MIN:MAX --endpoint HOST:PORT [--nproc-per-node P]
#                                  [--max-restarts R] [--rdzv-id ID] [-- TRAIN_FLAGS]
#
#   on every node:  bash 01-vanilla-pytorch-ddp/launch_multinode_ddp.sh --nnodes 2 \
#                       --endpoint 10.0.0.1:29500 -- --model small --data-dir /shared/cifar10
#
# --nproc-per-node defaults to the node's GPU count (1 on a CPU-only node). --data-dir and
# --checkpoint-dir should be on storage every node sees: rank 0 writes the checkpoint, all ranks read it.
# --max-restarts R: after a crash, or a node lost, every node still there starts its ranks again (at
# most R times), and train_ddp.py resumes from its checkpoint. With --nnodes MIN:MAX the restarted job
# may have fewer nodes, down to MIN, or more, up to MAX: it waits 30 s for more once MIN have joined.
# --rdzv-id: the same on every node of one job, and another for each job (a scheduler's job id): nodes
# join the rendezvous of their id only.
set -euo pipefail

usage() { sed -n 's/^# \{0,1\}//; 2,/^set /p' "$0" | sed '$d'; }
fail() { echo "error: $1" >&2; usage >&2; exit 2; }

nnodes="" endpoint="" nproc="" restarts=0 rdzv_id=launch_multinode_ddp
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nnodes) nnodes="$2"; shift 2 ;;
    --endpoint) endpoint="$2"; shift 2 ;;
    --nproc-per-node) nproc="$2"; shift 2 ;;
    --max-restarts) restarts="$2"; shift 2 ;;
    --rdzv-id) rdzv_id="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) fail "unknown option $1 (training flags go after --)" ;;
  esac
done
[[ -n "$nnodes" && -n "$endpoint" ]] || fail "--nnodes and --endpoint are required"
[[ "$endpoint" == *:* ]] || fail "--endpoint must be HOST:PORT, got $endpoint"
nproc="${nproc:-$(python -c 'import torch; print(torch.cuda.device_count() or 1)')}"

# A store of its own for each restart: with the one torchrun shares, a restarted gloo rank may read a
# dead rank's address and fail or hang (README.md in this folder: Restarts).
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
exec torchrun --nnodes="$nnodes" --nproc-per-node="$nproc" --max-restarts="$restarts" \
  --rdzv-backend=c10d --rdzv-endpoint="$endpoint" --rdzv-id="$rdzv_id" \
  "$(dirname "$0")/train_ddp.py" "$@"
