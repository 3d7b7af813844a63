package policy

// The BPF object is built from bpf/policy.c with clang and embedded by
// bpf2go, as the dataplane's is (see ../gen.go). The generated
// policy_bpfel.go and policy_bpfel.o are committed; regenerate after editing
// bpf/ with
//
//	go generate ./dataplane/policy/...
//
// TestBPFObjectUpToDate fails when the committed files differ from what
// this line generates.

//go:generate go tool bpf2go -tags linux -target bpfel -type pol_ep -type pol_id_key -type pol_cidr_key -type pol_range -type pol_ports -type pol_ct_key policy bpf/policy.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu
