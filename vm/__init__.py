"""Boot a stock Debian kernel (which has sch_netem) under qemu TCG and run commands in it."""
