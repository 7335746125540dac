"""The tuning schedulers: the API every scheduler implements (`base`) and the
policies of the papers: `FIFO` (HyperDrive's Default), `ASHA` and
`HyperSched` (HyperSched 3-5), `POP` (HyperDrive 3), and HyperDrive's
baselines `Bandit` and `EarlyTerm`; the rungs of successive halving
(`rungs`), how POP and EarlyTerm reach the learning-curve predictor
(`forecasting`), and every scheduler as a Ray Tune trial scheduler
(`ray_tune`, the `ray` extra). A scheduler decides; it never starts a
process (that is `thrifty.runtime.tuning.executors`)."""
