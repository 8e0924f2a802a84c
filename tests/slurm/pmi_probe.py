"""A PMI-1 client, to run under a launcher: each rank puts a value of LENGTH characters,
meets the others at a barrier and reads rank 0's value back.  Exit 0 when every step got
its answer and the value came back whole; 1 otherwise.  It shows what a launcher's PMI
server makes of the long requests MPICH's own PMI-1 client sends at MPI_Init
(hpccoll.slurm.LAUNCHERS).  Usage: python pmi_probe.py LENGTH"""
import os
import socket
import sys


def connect() -> socket.socket:
    if "PMI_FD" in os.environ:
        return socket.socket(fileno=int(os.environ["PMI_FD"]))
    host, port = os.environ["PMI_PORT"].rsplit(":", 1)
    return socket.create_connection((host, int(port)))


def main(length: int) -> int:
    rank = os.environ.get("PMI_RANK", "?")
    sock = connect()
    sock.settimeout(10)                   # a server that lost the request never answers
    replies = sock.makefile("rb")

    def ask(request: str) -> dict:
        sock.sendall(request.encode() + b"\n")
        words = replies.readline().decode().split()
        return dict(w.split("=", 1) for w in words if "=" in w)

    ask("cmd=init pmi_version=1 pmi_subversion=1")
    kvs = ask("cmd=get_my_kvsname")["kvsname"]
    value = ("%x" % (int(rank) + 10 if rank.isdigit() else 15)) * length
    request = f"cmd=put kvsname={kvs} key=probe-{rank} value={value}"
    try:
        put = ask(request)
        ask("cmd=barrier_in")
        got = ask(f"cmd=get kvsname={kvs} key=probe-0")
        ask("cmd=finalize")
    except TimeoutError:
        print(f"rank {rank}: put of {len(request) + 1} bytes: no answer within 10 s (the "
              f"server lost a request)", flush=True)
        return 1
    whole = got.get("rc") == "0" and got.get("value") == "a" * length
    print(f"rank {rank}: put of {len(request) + 1} bytes: rc={put.get('rc')}; rank 0's value "
          f"{'came back whole' if whole else 'did not come back: ' + str(got)[:80]}",
          flush=True)
    return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
