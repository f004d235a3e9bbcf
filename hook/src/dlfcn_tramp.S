/* dlsym/dlvsym interposers.  When the name is not one of ours they *jump* to glibc's
 * function, so glibc sees the caller's return address and RTLD_NEXT keeps its meaning
 * (relative to the caller, not to libtessera). */
#if defined(__x86_64__)
    .text
    .globl dlsym
    .type dlsym, @function
dlsym:
    push %rdi
    push %rsi
    sub $8, %rsp
    call tessera_dlsym_filter
    add $8, %rsp
    pop %rsi
    pop %rdi
    test %rax, %rax
    jnz 1f
    jmp *tessera_real_dlsym(%rip)
1:  ret
    .size dlsym, .-dlsym

    .globl dlvsym
    .type dlvsym, @function
dlvsym:
    push %rdi
    push %rsi
    push %rdx
    call tessera_dlvsym_filter
    pop %rdx
    pop %rsi
    pop %rdi
    test %rax, %rax
    jnz 2f
    jmp *tessera_real_dlvsym(%rip)
2:  ret
    .size dlvsym, .-dlvsym
#else
#error "libtessera: dlsym trampolines exist for x86_64 only"
#endif
    .section .note.GNU-stack,"",@progbits
