package apiserver

import (
	"errors"
	"net/url"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// wantClientError fails unless err is nil or a 4xx Status.
func wantClientError(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a StatusError", err, err)
	}
	if c := se.ErrStatus.Code; c < 400 || c >= 500 {
		t.Fatalf("error %v has code %d, want 4xx", err, c)
	}
}

func FuzzDecodeBody(f *testing.F) {
	f.Add(uint8(0), uint8(0), []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":"v"}}`))
	f.Add(uint8(1), uint8(0), []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"}]}}`))
	f.Add(uint8(2), uint8(1), []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  replicas: 2\n  foo: 1\n"))
	f.Add(uint8(0), uint8(1), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, name: b}\n"))
	f.Add(uint8(1), uint8(0), []byte(`{"apiVersion":"v1","kind":"Pod","spec":{"containers":"x"}}`))
	f.Add(uint8(2), uint8(2), []byte{0x6b, 0x38, 0x73, 0x00, 0x0a, 0x02})
	s, err := New(Config{Storage: untouchable{}, Kinds: testKinds})
	if err != nil {
		f.Fatal(err)
	}
	gvks := []schema.GroupVersionKind{
		corev1.SchemeGroupVersion.WithKind("ConfigMap"),
		corev1.SchemeGroupVersion.WithKind("Pod"),
		appsv1.SchemeGroupVersion.WithKind("Deployment"),
	}
	medias := []string{mediaJSON, mediaYAML, mediaProtobuf}
	validations := []string{metav1.FieldValidationStrict, metav1.FieldValidationWarn, metav1.FieldValidationIgnore}
	f.Fuzz(func(t *testing.T, which, media uint8, body []byte) {
		gvk := gvks[int(which)%len(gvks)]
		info, _ := s.serializerFor(medias[int(media)%len(medias)])
		for _, v := range validations {
			into, _ := s.scheme.New(gvk)
			obj, _, err := s.decodeWith(info, body, gvk, into, v)
			wantClientError(t, err)
			if err == nil && obj.GetObjectKind().GroupVersionKind() != gvk {
				if _, ok := obj.(interface{ GetName() string }); !ok {
					t.Fatalf("decoded %T for %s", obj, gvk)
				}
			}
		}
	})
}

func FuzzApplyPatch(f *testing.F) {
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i","ports":[{"containerPort":80}]}]}}`)
	f.Add(uint8(0), []byte(`[{"op":"replace","path":"/metadata/labels/a","value":"c"}]`))
	f.Add(uint8(0), []byte(`[{"op":"test","path":"/metadata/name","value":"q"}]`))
	f.Add(uint8(0), []byte(`[{"op":"remove","path":"/spec/nope"}]`))
	f.Add(uint8(1), []byte(`{"metadata":{"labels":{"a":null,"x":"y"}}}`))
	f.Add(uint8(1), []byte(`[1,2`))
	f.Add(uint8(2), []byte(`{"spec":{"containers":[{"name":"c","image":"j"}]}}`))
	f.Add(uint8(2), []byte(`{"spec":{"containers":[{"$patch":"delete","name":"c"}]}}`))
	f.Add(uint8(2), []byte(`{"spec":{"$setElementOrder/containers":[{"name":"z"}]}}`))
	pts := []types.PatchType{types.JSONPatchType, types.MergePatchType, types.StrategicMergePatchType}
	f.Fuzz(func(t *testing.T, which uint8, patch []byte) {
		_, err := applyPatch(pts[int(which)%len(pts)], pod, patch, &corev1.Pod{})
		wantClientError(t, err)
	})
}

func FuzzListOptions(f *testing.F) {
	f.Add("labelSelector=app%3Dweb&limit=500")
	f.Add("fieldSelector=metadata.name%3Dx,status.phase!%3DRunning&watch=true&resourceVersion=12&allowWatchBookmarks=true")
	f.Add("labelSelector=a+in+(b,c),!d")
	f.Add("labelSelector=%3D%3D%3D&timeoutSeconds=-1")
	f.Add("sendInitialEvents=true&resourceVersionMatch=NotOlderThan")
	f.Add("limit=abc&continue=%00")
	f.Fuzz(func(t *testing.T, query string) {
		q, err := url.ParseQuery(query)
		if err != nil {
			return
		}
		_, err = decodeListOptions(q)
		wantClientError(t, err)
	})
}
