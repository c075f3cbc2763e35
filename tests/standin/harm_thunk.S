/* The harm test's call thunk (issue 44): calls a driver entry point through a function pointer
 * with every callee-saved register, and the floating-point control register, loaded with a
 * pattern derived from SEED, then checks them after the call.
 *
 *   uint64_t harm_call(void *fn, const uint64_t args[12], uint64_t seed, uint64_t *bad);
 *
 * args[0..5] (x86-64) or args[0..7] (aarch64) go in registers, the rest on the stack as the
 * calling convention places them; the return value is the callee's. *bad gets one bit per
 * register found changed: x86-64 bit 0 rbx, 1 rbp, 2-5 r12-r15, 6 MXCSR's control bits;
 * aarch64 bits 0-10 x19-x29, 11-18 d8-d15, 19 FPCR's control bits.
 *
 *   void harm_clobber(void);   changes rbx / x19 (and nothing it must not): the thunk's own
 *                              check that it can see a clobber.
 */
#if defined(__x86_64__)
    .text
    .globl harm_call
    .type harm_call, @function
harm_call:
    push %rbp
    mov %rsp, %rbp
    push %rbx
    push %r12
    push %r13
    push %r14
    push %r15
    sub $40, %rsp                  /* 0 fn, 8 seed, 16 bad, 24 saved MXCSR, 32 scratch */
    mov %rdi, 0(%rsp)
    mov %rdx, 8(%rsp)
    mov %rcx, 16(%rsp)
    stmxcsr 24(%rsp)
    mov %rsi, %r11
    pushq 88(%r11)                 /* stack arguments 6-11, the 7th at the lowest address */
    pushq 80(%r11)
    pushq 72(%r11)
    pushq 64(%r11)
    pushq 56(%r11)
    pushq 48(%r11)
    movl $0xbfc0, 80(%rsp)         /* FZ, DAZ, round down, all exceptions masked */
    ldmxcsr 80(%rsp)
    mov 56(%rsp), %rax             /* seed */
    mov %rax, %rbx
    lea 1(%rax), %rbp
    lea 2(%rax), %r12
    lea 3(%rax), %r13
    lea 4(%rax), %r14
    lea 5(%rax), %r15
    mov 0(%r11), %rdi
    mov 8(%r11), %rsi
    mov 16(%r11), %rdx
    mov 24(%r11), %rcx
    mov 32(%r11), %r8
    mov 40(%r11), %r9
    mov 48(%rsp), %r10             /* fn */
    call *%r10
    xor %ecx, %ecx
    mov 56(%rsp), %r10             /* seed */
    .macro want reg, bit
    cmp \reg, %r10
    je 1f
    or $\bit, %ecx
1:
    inc %r10
    .endm
    want %rbx, 1
    want %rbp, 2
    want %r12, 4
    want %r13, 8
    want %r14, 16
    want %r15, 32
    stmxcsr 80(%rsp)
    mov 80(%rsp), %edx
    and $0xffc0, %edx              /* control bits only: a callee may raise exception flags */
    cmp $0xbfc0, %edx
    je 2f
    or $64, %ecx
2:
    mov 64(%rsp), %rdx             /* bad */
    mov %rcx, (%rdx)
    add $48, %rsp
    ldmxcsr 24(%rsp)
    add $40, %rsp
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbx
    pop %rbp
    ret
    .size harm_call, .-harm_call

    .globl harm_clobber
    .type harm_clobber, @function
harm_clobber:
    xor %ebx, %ebx
    ret
    .size harm_clobber, .-harm_clobber
#elif defined(__aarch64__)
    .text
    .globl harm_call
    .type harm_call, %function
harm_call:
    stp x29, x30, [sp, #-176]!
    stp x19, x20, [sp, #16]
    stp x21, x22, [sp, #32]
    stp x23, x24, [sp, #48]
    stp x25, x26, [sp, #64]
    stp x27, x28, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mrs x9, fpcr
    str x9, [sp, #160]
    str x3, [sp, #168]             /* bad */
    sub sp, sp, #48                /* stack arguments 8-11 at 0-31, seed at 32 */
    ldp x9, x10, [x1, #64]
    stp x9, x10, [sp]
    ldp x9, x10, [x1, #80]
    stp x9, x10, [sp, #16]
    str x2, [sp, #32]
    mov x16, x0
    movz x9, #0x0140, lsl #16      /* FZ, round towards plus infinity */
    msr fpcr, x9
    mov x19, x2
    add x20, x2, #1
    add x21, x2, #2
    add x22, x2, #3
    add x23, x2, #4
    add x24, x2, #5
    add x25, x2, #6
    add x26, x2, #7
    add x27, x2, #8
    add x28, x2, #9
    add x29, x2, #10
    .irp n, 8, 9, 10, 11, 12, 13, 14, 15
    add x9, x2, #(\n + 3)
    fmov d\n, x9
    .endr
    ldp x2, x3, [x1, #16]
    ldp x4, x5, [x1, #32]
    ldp x6, x7, [x1, #48]
    ldp x0, x1, [x1]
    blr x16
    ldr x9, [sp, #32]              /* seed */
    mov x10, #0
    .macro want reg, bit
    eor x11, \reg, x9
    cbz x11, 1f
    orr x10, x10, #(1 << \bit)
1:
    add x9, x9, #1
    .endm
    want x19, 0
    want x20, 1
    want x21, 2
    want x22, 3
    want x23, 4
    want x24, 5
    want x25, 6
    want x26, 7
    want x27, 8
    want x28, 9
    want x29, 10
    .macro wantd n, bit
    fmov x11, d\n
    eor x11, x11, x9
    cbz x11, 1f
    orr x10, x10, #(1 << \bit)
1:
    add x9, x9, #1
    .endm
    wantd 8, 11
    wantd 9, 12
    wantd 10, 13
    wantd 11, 14
    wantd 12, 15
    wantd 13, 16
    wantd 14, 17
    wantd 15, 18
    mrs x11, fpcr
    and x11, x11, #0x07c00000      /* AHP, DN, FZ, RMode */
    movz x9, #0x0140, lsl #16
    cmp x11, x9
    b.eq 2f
    orr x10, x10, #(1 << 19)
2:
    ldr x11, [sp, #48 + 168]
    str x10, [x11]
    add sp, sp, #48
    ldr x9, [sp, #160]
    msr fpcr, x9
    ldp d14, d15, [sp, #144]
    ldp d12, d13, [sp, #128]
    ldp d10, d11, [sp, #112]
    ldp d8, d9, [sp, #96]
    ldp x27, x28, [sp, #80]
    ldp x25, x26, [sp, #64]
    ldp x23, x24, [sp, #48]
    ldp x21, x22, [sp, #32]
    ldp x19, x20, [sp, #16]
    ldp x29, x30, [sp], #176
    ret
    .size harm_call, .-harm_call

    .globl harm_clobber
    .type harm_clobber, %function
harm_clobber:
    mov x19, #0
    ret
    .size harm_clobber, .-harm_clobber
#else
#error "harm_thunk.S: x86-64 or aarch64 only"
#endif
    .section .note.GNU-stack, "", %progbits
