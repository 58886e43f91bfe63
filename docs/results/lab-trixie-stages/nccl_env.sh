# nccl_env.sh for cluster 'lab' (fabric: ethernet, GPUs per node: 0).
# Rendered from lcm_runner/templates/nccl_env.sh.j2 by `lcm-runner render` or the nccl role: do not
# edit, change the cluster spec (or the run config's nccl.extra_env) and render again.
# Source it before launching: `. nccl_env.sh`.

# Bootstrap and Socket-transport traffic only on the interface the spec names (never docker0/lo).
export NCCL_SOCKET_IFNAME='eth0'

# torch's gloo backend (CPU collectives, the lab) binds to the same interface.
export GLOO_SOCKET_IFNAME='eth0'

# Ethernet-only fabric: no RDMA devices, so NCCL skips IB probing and uses its Socket transport.
export NCCL_IB_DISABLE='1'

# WARN in production; INFO only when profiling (it logs every channel).
export NCCL_DEBUG='INFO'
