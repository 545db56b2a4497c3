#!/bin/sh
# Runs inside the node image while it is built (see build-node-image.sh): the steps of Kind's
# base image Dockerfile, adapted to Debian's containerd and runc and to this project's hosts.
set -eu

chmod 0755 /usr/local/bin/* /kind/bin/* /usr/bin/kubeadm /usr/bin/kubelet /usr/bin/kubectl /usr/sbin/runc.wrapper

# Debian's containerd lives in /usr/bin, not where Kind's unit expects it; the fuse-overlayfs
# snapshotter is for rootless hosts and is not installed.
sed -i 's|^ExecStart=/usr/local/bin/containerd|ExecStart=/usr/bin/containerd|' /etc/systemd/system/containerd.service
rm -f /etc/systemd/system/containerd-fuse-overlayfs.service

# Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which these hosts withhold: without
# this every static pod fails with "can't get final child's PID from pipe: EOF".
sed -i 's|restrict_oom_score_adj = false|restrict_oom_score_adj = true|' /etc/containerd/config.toml
grep -q 'restrict_oom_score_adj = true' /etc/containerd/config.toml

# Privileged pods need the same capability fix as the host's Docker: runc becomes the wrapper.
mv /usr/sbin/runc /usr/sbin/runc.real
mv /usr/sbin/runc.wrapper /usr/sbin/runc

# As Kind's base image: no units that make no sense in a container.
find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
  /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
  /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> /etc/systemd/journald.conf
ln -sf "$(command -v systemd)" /sbin/init
systemctl enable kubelet.service containerd.service undo-mount-hacks.service
systemctl mask systemd-binfmt.service

mkdir -p /etc/kubernetes/manifests /opt/cni/bin
for plugin in ptp host-local portmap loopback bridge; do cp "/usr/lib/cni/$plugin" /opt/cni/bin/; done

ctr oci spec \
  | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json

echo "$KUBERNETES_VERSION" > /kind/version
