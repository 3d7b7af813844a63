package policy

import "k8s.io/apimachinery/pkg/util/intstr"

func ptrIntStr(s string) *intstr.IntOrString {
	v := intstr.FromString(s)
	return &v
}

func ptrInt(n int32) *intstr.IntOrString {
	v := intstr.FromInt32(n)
	return &v
}
