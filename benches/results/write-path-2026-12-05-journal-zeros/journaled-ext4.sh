#!/bin/bash
# journaled-ext4.sh: an ext4 file system with a journal (mkfs.ext4's defaults), mounted at /mnt/j, on a
# loop device with direct I/O over a zero-filled 4 GiB image on this machine's disk (whose own root file
# system has no journal). TWINHUB_BENCH_TMP=/mnt/j puts the bench's clusters there.
set -e
dd if=/dev/zero of=/work/ext4j.img bs=16M count=256 conv=fsync status=none
L=$(losetup --direct-io=on -f --show /work/ext4j.img)
mkfs.ext4 -q -F "$L"
mkdir -p /mnt/j
mount "$L" /mnt/j
ls /proc/fs/jbd2/   # the new file system's journal: loopN-8
