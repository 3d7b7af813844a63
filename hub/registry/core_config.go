package registry

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var configMapKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("ConfigMap"),
	Resource:   "configmaps",
	Singular:   "configmap",
	Namespaced: true,
	ShortNames: []string{"cm"},
	Validate:   func(obj runtime.Object) field.ErrorList { return validateConfigMap(obj.(*corev1.ConfigMap)) },
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		cm, o := obj.(*corev1.ConfigMap), old.(*corev1.ConfigMap)
		errs := validateConfigMap(cm)
		if o.Immutable != nil && *o.Immutable {
			if cm.Immutable == nil || !*cm.Immutable {
				errs = append(errs, field.Forbidden(field.NewPath("immutable"), "field is immutable when `immutable` is set"))
			}
			if !apiequality.Semantic.DeepEqual(cm.Data, o.Data) {
				errs = append(errs, field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set"))
			}
			if !apiequality.Semantic.DeepEqual(cm.BinaryData, o.BinaryData) {
				errs = append(errs, field.Forbidden(field.NewPath("binaryData"), "field is immutable when `immutable` is set"))
			}
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Data", "string", 0, "Data contains the configuration data."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		cm := obj.(*corev1.ConfigMap)
		return []any{cm.Name, int64(len(cm.Data) + len(cm.BinaryData)), age(cm.CreationTimestamp, now)}
	},
}

func validateConfigMap(cm *corev1.ConfigMap) field.ErrorList {
	var errs field.ErrorList
	total := 0
	for k, v := range cm.Data {
		p := field.NewPath("data").Key(k)
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(p, k, msg))
		}
		if _, dup := cm.BinaryData[k]; dup {
			errs = append(errs, field.Invalid(p, k, "duplicate of key present in binaryData"))
		}
		total += len(v)
	}
	for k, v := range cm.BinaryData {
		p := field.NewPath("binaryData").Key(k)
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(p, k, msg))
		}
		if _, dup := cm.Data[k]; dup {
			errs = append(errs, field.Invalid(p, k, "duplicate of key present in data"))
		}
		total += len(v)
	}
	if total > maxConfigSize {
		errs = append(errs, field.TooLong(field.NewPath(""), "", maxConfigSize))
	}
	return errs
}

var secretKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("Secret"),
	Resource:   "secrets",
	Singular:   "secret",
	Namespaced: true,
	Default: func(obj runtime.Object) {
		s := obj.(*corev1.Secret)
		if s.Type == "" {
			s.Type = corev1.SecretTypeOpaque
		}
		// stringData is write-only: merge it into data.
		if len(s.StringData) > 0 {
			if s.Data == nil {
				s.Data = map[string][]byte{}
			}
			for k, v := range s.StringData {
				s.Data[k] = []byte(v)
			}
		}
		s.StringData = nil
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validateSecret(obj.(*corev1.Secret)) },
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		s, o := obj.(*corev1.Secret), old.(*corev1.Secret)
		errs := validateSecret(s)
		errs = append(errs, immutable(s.Type, o.Type, field.NewPath("type"))...)
		if o.Immutable != nil && *o.Immutable {
			if s.Immutable == nil || !*s.Immutable {
				errs = append(errs, field.Forbidden(field.NewPath("immutable"), "field is immutable when `immutable` is set"))
			}
			if !apiequality.Semantic.DeepEqual(s.Data, o.Data) {
				errs = append(errs, field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set"))
			}
		}
		return errs
	},
	Fields: func(obj runtime.Object) fields.Set {
		return fields.Set{"type": string(obj.(*corev1.Secret).Type)}
	},
	FieldLabels: []string{"type"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Type", "string", 0, "Used to facilitate programmatic handling of secret data."),
		column("Data", "string", 0, "Data contains the secret data."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		s := obj.(*corev1.Secret)
		return []any{s.Name, string(s.Type), int64(len(s.Data)), age(s.CreationTimestamp, now)}
	},
}

func validateSecret(s *corev1.Secret) field.ErrorList {
	var errs field.ErrorList
	dp := field.NewPath("data")
	total := 0
	for k, v := range s.Data {
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(dp.Key(k), k, msg))
		}
		total += len(v)
	}
	if total > maxConfigSize {
		errs = append(errs, field.TooLong(dp, "", maxConfigSize))
	}
	requireKey := func(k string) {
		if _, ok := s.Data[k]; !ok {
			errs = append(errs, field.Required(dp.Key(k), ""))
		}
	}
	jsonKey := func(k string) {
		v, ok := s.Data[k]
		if !ok {
			errs = append(errs, field.Required(dp.Key(k), ""))
			return
		}
		var x map[string]any
		if err := jsonUnmarshal(v, &x); err != nil {
			errs = append(errs, field.Invalid(dp.Key(k), "<secret contents redacted>", err.Error()))
		}
	}
	switch s.Type {
	case corev1.SecretTypeServiceAccountToken:
		if s.Annotations[corev1.ServiceAccountNameKey] == "" {
			errs = append(errs, field.Required(field.NewPath("metadata", "annotations").Key(corev1.ServiceAccountNameKey), ""))
		}
	case corev1.SecretTypeDockercfg:
		jsonKey(corev1.DockerConfigKey)
	case corev1.SecretTypeDockerConfigJson:
		jsonKey(corev1.DockerConfigJsonKey)
	case corev1.SecretTypeBasicAuth:
		_, u := s.Data[corev1.BasicAuthUsernameKey]
		_, p := s.Data[corev1.BasicAuthPasswordKey]
		if !u && !p {
			errs = append(errs, field.Required(dp.Key(corev1.BasicAuthUsernameKey), ""),
				field.Required(dp.Key(corev1.BasicAuthPasswordKey), ""))
		}
	case corev1.SecretTypeSSHAuth:
		requireKey(corev1.SSHAuthPrivateKey)
	case corev1.SecretTypeTLS:
		requireKey(corev1.TLSCertKey)
		requireKey(corev1.TLSPrivateKeyKey)
	}
	return errs
}
