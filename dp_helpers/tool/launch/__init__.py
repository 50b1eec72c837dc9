"""run_ddp(): launch a script under torchrun from a notebook or a terminal, stream it, and clean up (taught in notebook 03).

Never mp.spawn or fork from a kernel: spawn cannot pickle functions defined in a notebook, and fork
breaks once CUDA is initialised. Each launch is a fresh torchrun in its own session; an interrupt, a
timeout or the death of this process takes the whole tree down with it. One module per job:

    command.py   the launch plan: torchrun's command line, the workers' environment, the run folder
    agent.py     torchrun as started here: dies with its launcher, records failures as JSON
    process.py   start a process tree, remember its members, stop all of them
    console.py   stream output to the screen and to console.log, follow rank 0's progress
    diagnose.py  which rank failed and why, from the recorded failures (torchrun's text as fallback)
    run.py       run_ddp() and RunResult, which tie the above together
    runners.py   run_train(), run_json(): the training job and JSON-writing scripts
    nodes.py     run_local_nodes(): several "nodes" on one machine
"""

from dp_helpers.tool.launch.diagnose import DistributedRunError, RunTimeoutError
from dp_helpers.tool.launch.nodes import run_local_nodes
from dp_helpers.tool.launch.run import RunResult, run_ddp
from dp_helpers.tool.launch.runners import run_json, run_train

__all__ = ["DistributedRunError", "RunResult", "RunTimeoutError", "run_ddp", "run_json",
           "run_local_nodes", "run_train"]
