"""How long a gloo broadcast of a host buffer takes between two local processes (the TP leader's per-step message
to its peers travels so): a 16 KB frame, a 240 KB and a 1 MB buffer, broadcast and send/recv, median of 20 each.
Run it with and without GLOO_SOCKET_IFNAME=lo to see whether the interface gloo picked is the slow part.

  python experiments/gloo_broadcast_probe.py
"""
import os, time, torch, torch.distributed as dist, torch.multiprocessing as mp, statistics
def run(rank, n):
    os.environ["MASTER_ADDR"]="127.0.0.1"; os.environ["MASTER_PORT"]="29533"
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for size in (16384, 246140, 1<<20):
        x=torch.zeros(size,dtype=torch.uint8); ts=[]
        for i in range(20):
            dist.barrier(); t=time.perf_counter(); dist.broadcast(x,src=0); ts.append(time.perf_counter()-t)
        if rank==0: print("bcast", size, "median %.3f ms"%(1e3*statistics.median(ts)))
        # send/recv
        ts=[]
        for i in range(20):
            dist.barrier(); t=time.perf_counter()
            if rank==0: dist.send(x,1)
            else: dist.recv(x,0)
            ts.append(time.perf_counter()-t)
        if rank==0: print("send", size, "median %.3f ms"%(1e3*statistics.median(ts)))
    dist.destroy_process_group()
if __name__=="__main__":
    mp.spawn(run, args=(2,), nprocs=2)
