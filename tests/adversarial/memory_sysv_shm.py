"""SysV shared memory held by no process: 2.5 GB in segments attached, filled and detached, past every rlimit.

target: mask_to_bias
zero: mask_to_bias
full: causal_mask, padding_mask, combine_masks
log: reached the sandbox's memory limit
log: mask_to_bias: failed: stopped: your notebook's processes together used more than
"""
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
for _ in range(10):
    key = libc.shmget(0, 256 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    address = libc.shmat(key, None, 0)
    ctypes.memset(address, 1, 256 << 20)
    libc.shmdt(ctypes.c_void_p(address))
