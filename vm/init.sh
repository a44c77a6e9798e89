#!/bin/busybox sh
# /init of the pddlab VM (PID 1, busybox ash). Built into the initramfs by
# vm/initramfs.py; the run it serves is described by /pddlab/env and
# /pddlab/cmd.sh, which vm/run.py appends as a second cpio archive.
#
# Does: load the modules in /lib/pddlab/load.list, mount the host's root
# (virtiofs tag "hostroot", read-only) under a tmpfs overlay as /newroot, give
# it fresh proc/sys/dev/devpts/cgroup2 and /run, mount the share directory
# (tag "share", writable) at its host path, run cmd.sh chrooted with its
# output on ttyS1 after switch_root into /newroot, print "PDDLAB-RC=<status>"
# on the console (ttyS0), power off.
# Does not: configure any network beyond lo (the VM has no NIC), or decide
# what runs (cmd.sh is written by vm/run.py).

/bin/busybox mkdir -p /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
R=/newroot

log() { echo "pddlab-init: $*" > /dev/console; }
fail() {
    echo "PDDLAB-ERROR: $*" > /dev/console
    poweroff -f
    sleep 10
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
. /pddlab/env || fail "no /pddlab/env (the per-run archive is missing)"
REL=$(cat /lib/pddlab/release)

while read -r mod; do
    insmod "/lib/pddlab/$mod.ko" || fail "insmod $mod"
done < /lib/pddlab/load.list

# The virtio devices are probed by the insmods above; retry briefly in case
# the probe is still running.
mount_retry() {
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        mount "$@" 2>/dev/null && return 0
        sleep 0.5
    done
    mount "$@" || fail "mount $*"
}

mkdir -p /mnt/host /mnt/rw
mount_retry -t virtiofs -o ro hostroot /mnt/host
mount -t tmpfs -o mode=755 rwlayer /mnt/rw || fail "tmpfs for the overlay"
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay -o lowerdir=/mnt/host,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work \
    overlay $R || fail "overlay over the host root"

mount -t proc proc $R/proc || fail "proc"
mount -t sysfs sysfs $R/sys || fail "sysfs"
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup || fail "cgroup2"
mount -t devtmpfs devtmpfs $R/dev || fail "devtmpfs"
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts $R/dev/pts || fail "devpts"
mount -t tmpfs -o mode=1777 shm $R/dev/shm || fail "/dev/shm"
mount -t tmpfs -o mode=755 run $R/run || fail "/run"
mkdir -p "$R$PDDLAB_SHARE" $R/run/pddlab
mount_retry -t virtiofs share "$R$PDDLAB_SHARE"

# modprobe, both the kernel's (request_module runs /sbin/modprobe of this
# initramfs) and the host's inside the chroot, finds the full module tree.
mkdir -p /lib/modules
ln -s "$R$PDDLAB_MODULES" "/lib/modules/$REL"
chroot $R /bin/mkdir -p /lib/modules
chroot $R /bin/ln -sfn "$PDDLAB_MODULES" "/lib/modules/$REL"

hostname pddlab-vm
ip link set lo up || fail "lo up"
cp /pddlab/cmd.sh $R/run/pddlab/cmd.sh
stty -F /dev/ttyS1 raw -echo || fail "ttyS1 (is the second serial port missing?)"

# switch_root, not chroot: tools that enter another process's mount namespace
# (Mininet's mnexec -a) land at that namespace's root, which must be the host
# root itself, not the initramfs beneath a chroot.
cat > $R/run/pddlab/stage2.sh <<'STAGE2'
log() { echo "pddlab-init: $*" > /dev/console; }
log "PDDLAB-START uptime=$(cut -d' ' -f1 /proc/uptime)"
env -i /bin/sh /run/pddlab/cmd.sh < /dev/null > /dev/ttyS1 2>&1
rc=$?
kill -KILL -1 2>/dev/null  # whatever the command left running
sync
umount -l "$1" 2>/dev/null
echo "PDDLAB-RC=$rc" > /dev/console
echo 1 > /proc/sys/kernel/sysrq
echo o > /proc/sysrq-trigger  # power off (the host root may have no poweroff binary)
sleep 10
STAGE2
exec switch_root $R /bin/sh /run/pddlab/stage2.sh "$PDDLAB_SHARE"
