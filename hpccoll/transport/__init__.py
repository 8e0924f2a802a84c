"""Transports: how a collective's bytes move.

- ``mpi``: MPI point-to-point on the communicator's private duplicate (works with any
  MPI and any placement);
- ``shm``: node-shared memory (a file in /dev/shm per communicator and node, mapped by
  its ranks) for the ranks of a communicator that share a node.

Which one a collective uses is decided by the algorithm table
(``hpccoll.algorithms.TABLE``), whose rows are ordered by preference.
"""
