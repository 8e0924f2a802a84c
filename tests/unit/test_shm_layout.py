"""transport/shm.layout: which ranks of a communicator share a node, computed by every
rank from the world's node map alone (no message), as the node-shared area needs it."""
from hpccoll.transport.shm import layout


def test_one_node():
    node_of = (0, 0, 0, 0)
    assert layout(2, (0, 1, 2, 3), node_of) == ((0, 1, 2, 3), (2,))


def test_two_nodes_in_blocks_and_round_robin():
    blocks = (0, 0, 2, 2)                       # world ranks 0,1 on node 0; 2,3 on node 2
    assert layout(3, (0, 1, 2, 3), blocks) == ((2, 3), (1, 3))
    assert layout(0, (0, 1, 2, 3), blocks) == ((0, 1), (0, 2))
    round_robin = (0, 1, 0, 1)
    assert layout(1, (0, 1, 2, 3), round_robin) == ((1, 3), (0, 1))


def test_communicator_ranks_not_world_ranks():
    """A communicator of world ranks 3, 1, 2 (in that order): local lists its own ranks."""
    node_of = (0, 0, 0, 0)
    assert layout(0, (3, 1, 2), node_of) == ((0, 1, 2), (0,))


def test_unequal_nodes_have_no_cross():
    node_of = (0, 0, 0, 3, 3)
    assert layout(4, (0, 1, 2, 3, 4), node_of) == ((3, 4), None)


def test_a_rank_alone_on_its_node_turns_shared_memory_off_for_all():
    node_of = (0, 0, 2)
    for rank in range(3):
        assert layout(rank, (0, 1, 2), node_of) == (None, None)


def test_the_digest_board_says_posted_not_yet_and_reused():
    """The mismatch digest board (post_digest / digest_of, engine/check.py): two ranks'
    mappings of one real node-shared file; a reader tells a check not posted yet, posted
    (with its digest) and an entry the writer already reused for a later check."""
    import os
    import tempfile
    from hpccoll.transport.shm import BOARD_ENTRIES, ShmArea, segment_bytes
    fd, path = tempfile.mkstemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.ftruncate(fd, segment_bytes(256, 1) * 2)
        a, b = (ShmArea(path, None, r, 2, 256, 1, lambda: None) for r in range(2))
    finally:
        os.close(fd)
        os.unlink(path)
    assert b.digest_of(0, 0) == (-1, 0)                 # never posted
    a.post_digest(0, 12345)
    assert b.digest_of(0, 0) == (0, 12345)
    assert b.digest_of(0, 1)[0] < 1                     # the next one: not yet
    a.post_digest(BOARD_ENTRIES, (1 << 62) - 1)         # the same entry, reused
    assert b.digest_of(0, 0) == (BOARD_ENTRIES, (1 << 62) - 1)
    assert a.digest_of(1, 0) == (-1, 0)                 # b posted nothing
    for area in (a, b):
        area.free()
