"""Running plans on many machines: a Ray cluster as the engine.

Machines are Ray nodes; on each machine of a plan one agent actor
(`agent.MachineAgent`) starts the plan's worker processes with that node's
fork server; collectives are torch.distributed (gloo on CPU, NCCL on GPUs)
between them, with the rendezvous store on rank 0's machine. How ranks are
launched there (both the driver's and the node's side) is the worker-world
package's (`thrifty.runtime.worlds.ray`); this package is about the nodes.
`provider.RayProvider` hands out the cluster's nodes as machines (those of a
running cluster, or EC2 instances that join it), reports the nodes that die and the spot notices the agents see. An EC2
machine joins from its user data (`bootstrap.join_script`), whose last line,
``thrifty node join`` (`bootstrap.join_cluster`), starts its node with the
machine's marks (`resources`).

Importing this package imports no Ray; the modules that need it import it
when used.
"""
