"""The workshop's steps, one entry each: what the benchmarks run, the tables and the slides show, and the designed
diffs bound (tests/test_diffs.py). Adding a step is one entry here, plus its folder."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    name: str  # the benchmarks' name for it (compare_steps.py's runs, results.json's "step")
    script: str  # from the repository's root
    label: str  # its column in the comparison table and slide
    grows_from: str | None = None  # the script whose `diff -u` against this one teaches its lesson
    lesson: str | None = None  # that diff's lesson, as the slides list it
    diff_bound: int | None = None  # at most this many changed lines in that diff (some headroom for comments)
    diff_shows: tuple = ()  # lines that diff must show: the lesson itself
    # A column of the comparison table (the training strategies), when it says what you write by hand and what
    # happens when a worker dies
    by_hand: str = ""
    faults: str = ""


STEPS = [
    Step("single_machine", "01-vanilla-pytorch-ddp/train_single_machine.py", "one process (01)"),
    Step("ddp", "01-vanilla-pytorch-ddp/train_ddp.py", "torchrun DDP (01)",
         "01-vanilla-pytorch-ddp/train_single_machine.py", "01 one process → torchrun DDP", 70,
         ("+    model = DistributedDataParallel(model)  # on a GPU: the device set_device chose",
          '+    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0',
          "+            with contextlib.nullcontext() if last_micro_batch else model.no_sync():"),
         by_hand="process group, sampler and `set_epoch`, DDP wrap, metric reduction, rank-0 output, launch on every "
                 "node, resuming after a restart",
         faults="`torchrun --max-restarts N` restarts every rank on the same nodes; the script must resume from its "
                "own checkpoint, as step 01 does (tested)"),
    Step("ray_ddp", "02-ray-train-ddp/train_ray_ddp.py", "Ray DDP (02)",
         "01-vanilla-pytorch-ddp/train_ddp.py", "01 torchrun DDP → 02 Ray Train DDP", 132,
         ("+        ray.init(address=args.address, **init_options(args.address),",
          "+    model = ray.train.torch.prepare_model(model)",
          "+    train_loader = ray.train.torch.prepare_data_loader(train_loader)",
          "+            ray.train.report(history[-1], checkpoint=checkpoint)"),
         by_hand="`set_epoch`, metric reduction, a report on every rank",
         faults="the worker group restarts from the last checkpoint, on the nodes the cluster has then; runs kept by "
                "name in checkpoint storage (tested)"),
    Step("ray_ddp_data", "02-ray-train-ddp/train_ray_ddp_with_ray_data.py", "Ray DDP with Ray Data (02)",
         "02-ray-train-ddp/train_ray_ddp.py", "02 DataLoader → Ray Data", 82,
         ("+        datasets={\"train\": train_dataset(data, args.seed)},",)),
    Step("ray_fsdp", "03-ray-train-fsdp/train_ray_fsdp.py", "Ray FSDP1 (03)",
         "02-ray-train-ddp/train_ray_ddp.py", "02 DDP → 03 FSDP1", 66,
         ('+            model, parallel_strategy="fsdp",',),
         by_hand="as 02, plus the full-state gather for checkpoints",
         faults="restarts from the last checkpoint (tested)"),
    Step("ray_fsdp2", "04-ray-train-fsdp2/train_ray_fsdp2.py", "Ray FSDP2 (04)",
         "02-ray-train-ddp/train_ray_ddp.py", "02 DDP → 04 FSDP2", 148,
         ("+    shard_model(model, args, device)  # replaces prepare_model; the optimizer must come after it",
          "+            model.set_requires_gradient_sync(last_micro_batch)"),
         by_hand="as 02, plus `fully_shard` per block, meta-device build, sharded checkpoints (DCP)",
         faults="restarts, and resumes on another number of workers (tested)"),
    Step("ray_tp", "07-tensor-parallel/train_ray_tp.py", "Ray TP (07)",
         "04-ray-train-fsdp2/train_ray_fsdp2.py", "04 FSDP2 → 07 tensor parallel", 100,
         ('+    "self_attention.out_proj": RowwiseParallel(),  # ... and projects them: an all-reduce sums',
          '+    mesh = init_device_mesh(device.type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))',
          '+            parallelize_module(module, mesh["tp"], TP_PLAN)')),
    Step("ray_ddp_mlflow", "02-ray-train-ddp/train_ray_ddp_with_mlflow.py", "Ray DDP with MLflow (02)",
         "02-ray-train-ddp/train_ray_ddp.py", "02 → 02 with MLflow tracking", 48,
         ("+        tracked = find_or_create_run(STEP, ray.train.get_context().get_experiment_name())",
          "+        mlflow.start_run(run_id=tracked.info.run_id)",
          "+            mlflow.log_metrics(metrics, step=h[\"epoch\"])  # one transaction: the whole epoch or none",
          "+            mlflow.log_artifact(str(Path(folder) / \"model.pt\"))")),
    Step("ray_tune", "05-ray-tune/tune_ray_ddp.py", "Ray Tune (05)"),
    Step("inference", "06-ray-data-inference/batch_inference.py", "batch inference (06)"),
]


def step(name: str) -> Step:
    return next(s for s in STEPS if s.name == name)


def designed_pairs() -> list:
    """Each step that grows from another, as its diff is taught: (older script, newer script, bound, lines shown)."""
    return [(s.grows_from, s.script, s.diff_bound, list(s.diff_shows)) for s in STEPS if s.grows_from]
