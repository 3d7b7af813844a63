package policy

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func ptrIntStr(s string) *intstr.IntOrString {
	v := intstr.FromString(s)
	return &v
}

func ptrInt(n int32) *intstr.IntOrString {
	v := intstr.FromInt32(n)
	return &v
}

func ptrInt32(n int32) *int32 { return &n }

func ptrProto(p string) *corev1.Protocol {
	v := corev1.Protocol(p)
	return &v
}
