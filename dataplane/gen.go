package dataplane

// The BPF object is built from bpf/lb.c with clang and embedded by bpf2go.
// The generated lb_bpfel.go and lb_bpfel.o are committed, so building tether
// needs no clang; regenerate after editing bpf/ with
//
//	go generate ./dataplane/...
//
// (clang ≥ 14, libbpf headers: apt-get install clang llvm libbpf-dev). The
// multiarch include directory is where Debian keeps asm/types.h.
// internal/repotest fails when the committed files differ from what this
// line generates.

//go:generate go tool bpf2go -tags linux -target bpfel -type lb_addr -type fe_key -type fe_val -type fe_fast -type slot -type backend -type aff_key -type aff_val -type sk_rev -type sk_rnat -type sk_rnat_key -type sk_rnat_val -type ct4_key -type ct4_val -type rct4_val -type lb_cfg lb bpf/lb.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu
