"""dup() and free() in a loop until killed: every rank prints READY once the first
communicator is made, then goes on (tests/unit/test_killed_job.py kills the job)."""
import hpccoll

ctx = hpccoll.init()
for i in range(1_000_000):
    ctx.world.dup().free()
    if i == 0:
        print("READY", flush=True)
