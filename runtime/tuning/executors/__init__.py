"""The executors of the tuning loop: what carries out a scheduler's
decisions. `sim` runs trials as events on a virtual clock (synthetic and
replayed workloads); `worlds` runs them as torch worker worlds through a
launcher (this host's fork server, or Ray nodes); `plan` carries out a
tuning plan from the planner stage by stage (RubberBand 4.2-4.4)."""
