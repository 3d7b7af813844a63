package registry

// coreKinds returns the served kinds of the core (legacy) group, v1.
func coreKinds() []*Kind { return nil }
