/* Embeds the compiled XDP object in the binary, so xdpqd is one file to
 * deploy. XDPQ_BPF_OBJ is the object's path (set by CMake). */
	.section .rodata
	.balign 8
	.global xdpq_bpf_object_start
xdpq_bpf_object_start:
	.incbin XDPQ_BPF_OBJ
	.global xdpq_bpf_object_end
xdpq_bpf_object_end:
	.byte 0
	.section .note.GNU-stack,"",@progbits
