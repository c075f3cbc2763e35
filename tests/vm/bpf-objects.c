/* bpf-objects: counts the BPF programs, maps and links the kernel holds (the bpf(2) GET_NEXT_ID
 * walks that bpftool uses), one line: `programs=P maps=M links=L`. The VM test runs it before
 * cudatrace starts, while it runs and after it stops, to prove that a stop leaves nothing behind. */
#include <linux/bpf.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static long count(int cmd) {
    union bpf_attr attr;
    long n = 0;
    __u32 id = 0;
    for (;;) {
        memset(&attr, 0, sizeof attr);
        attr.start_id = id;
        if (syscall(__NR_bpf, cmd, &attr, sizeof attr) != 0) break; /* ENOENT: the last one */
        id = attr.next_id;
        n++;
    }
    return n;
}

int main(void) {
    printf("programs=%ld maps=%ld links=%ld\n", count(BPF_PROG_GET_NEXT_ID), count(BPF_MAP_GET_NEXT_ID),
           count(BPF_LINK_GET_NEXT_ID));
    return 0;
}
