"""Transports: how a collective's bytes move.

- ``mpi``: MPI point-to-point on the communicator's private duplicates (works with any
  MPI and any placement);
- ``shm``: node-shared memory set up by MPI (``MPI.Win.Allocate_shared``) for the ranks
  of a communicator that share a node.

Which one a collective uses is decided by the algorithm table
(``hpccoll.algorithms.TABLE``), whose rows are ordered by preference.
"""
