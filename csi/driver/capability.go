package driver

import (
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// allowedMountFlags are the mount options a volume may carry (a PersistentVolume's
// spec.mountOptions): they only restrict the bind mount. Anything else would be a request the
// FUSE file system served by the worker does not understand.
var allowedMountFlags = map[string]bool{"ro": true, "nosuid": true, "nodev": true, "noexec": true, "noatime": true}

// readerModes are the access modes in which a pod only reads.
var readerModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY: true,
	csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:  true,
}

// outputVolumeModes are what CreateVolume accepts: an output is written from one node (one copy
// in memory, made durable by lineage and checkpoints) and read, once complete, from any.
var outputVolumeModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:      true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY: true,
	csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:  true,
}

// checkFilesystemCapability checks what every Strata volume needs: a file system (never a
// block device), a known access mode and only mount flags that restrict a bind mount.
func checkFilesystemCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return fmt.Errorf("volume capability missing")
	}
	if c.GetBlock() != nil {
		return fmt.Errorf("block access is not supported: Strata volumes are file systems, use volumeMode Filesystem")
	}
	m := c.GetMount()
	if m == nil {
		return fmt.Errorf("volume capability has no access type: Strata volumes need the mount (file system) access type")
	}
	var bad []string
	for _, f := range m.GetMountFlags() {
		if !allowedMountFlags[f] {
			bad = append(bad, f)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("mount flags %s are not supported: Strata bind-mounts a FUSE file system and accepts only ro, nosuid, nodev, noexec and noatime",
			strings.Join(bad, ", "))
	}
	mode := c.GetAccessMode().GetMode()
	if _, known := csi.VolumeCapability_AccessMode_Mode_name[int32(mode)]; !known || mode == csi.VolumeCapability_AccessMode_UNKNOWN {
		return fmt.Errorf("volume capability has no known access mode (got %v)", mode)
	}
	return nil
}

// checkOutputCapability checks a capability asked of an output volume.
func checkOutputCapability(c *csi.VolumeCapability) error {
	if err := checkFilesystemCapability(c); err != nil {
		return err
	}
	if mode := c.GetAccessMode().GetMode(); !outputVolumeModes[mode] {
		return fmt.Errorf("access mode %v is not supported: output volumes are written from a single node (SINGLE_NODE_WRITER) and read from any (SINGLE_NODE_READER_ONLY, MULTI_NODE_READER_ONLY)", mode)
	}
	return nil
}
