"""Rank RAISE_RANK raises in Python while the others wait in an allreduce: the job ends
(MPI_Abort) with that rank's traceback, and no rank hangs."""

import os

import numpy as np

import ringrec

ringrec.init()
ringrec.allreduce(np.ones(4, np.float32), name="before")
if ringrec.rank() == int(os.environ.get("RAISE_RANK", "1")):
    raise KeyError("boom on purpose from rank %d" % ringrec.rank())
ringrec.allreduce(np.ones(4, np.float32), name="never")
print("unreachable: rank %d finished" % ringrec.rank(), flush=True)
