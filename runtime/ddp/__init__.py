"""The DDP kit: one rank of synchronous data-parallel training, shared by
training jobs (`thrifty.runtime.training`) and tuning trials
(`thrifty.runtime.tuning`).

- `trainer`: what a user trains (`Trainer`, `TunableTrainer`) and how a
  factory name loads in a worker process;
- `job`: what one world is asked to do (`JobSpec`) and the names the starter
  and the ranks share; `worker`: the one entry point of every rank (training
  jobs and tuning trials), which takes the job as JSON;
- `sharding`, `reweight`, `checkpoint`: per-rank batches of the global
  batch, gradient reweighting (Srifty 4.5), atomic checkpoints and random
  states;
- `storage`: where a checkpoint lives, a path or an ``s3://bucket/key``
  URL that every machine reaches, with atomic writes on both;
- `steps` and `loop`: the pieces of a step and the one rank loop
  (`run_rank`). These two import torch; the rest does not, so the driver
  and the executors import this package without it.
"""
