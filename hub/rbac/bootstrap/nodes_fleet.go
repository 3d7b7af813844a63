package bootstrap

import (
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/tether-edge/tether/internal/fleetapi"
	"github.com/tether-edge/tether/join"
)

// ImageStagingReaderRole lets nodes (group system:nodes) read the
// ImageStagings, which say which images each agent pulls ahead of need.
// The node authorizer decides nothing about them, so its Next, RBAC,
// grants them through this role; the Events an agent records about a
// staging it failed are the node authorizer's already.
const ImageStagingReaderRole = "system:tether:imagestaging-reader"

// nodeFleetRoles are the roles bound to every node for the fleet kinds.
func nodeFleetRoles() []rbacv1.ClusterRole {
	return []rbacv1.ClusterRole{
		clusterRole(ImageStagingReaderRole, nil, rule(read, fleetapi.Group, fleetapi.ImageStagingsResource.Resource)),
	}
}

// nodeFleetBindings bind nodeFleetRoles to group system:nodes.
func nodeFleetBindings() []rbacv1.ClusterRoleBinding {
	return []rbacv1.ClusterRoleBinding{
		clusterRoleBinding(ImageStagingReaderRole, ImageStagingReaderRole, group(join.NodesGroup)),
	}
}
