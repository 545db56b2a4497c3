package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/humanize"
)

// Backup asks the operator to back the master up now, and says where the backup went. Strata's
// namespace holds the ConfigMap that records backups; only who may update it there may ask.
func (c *CLI) Backup(ctx context.Context) error {
	cm := &corev1.ConfigMap{}
	key := client.ObjectKey{Namespace: c.StrataNamespace, Name: datav1alpha1.MasterBackupsConfigMap}
	if err := c.Client.Get(ctx, key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("the master is not backed up: there is no ConfigMap %s/%s; install Strata with master.backup.uri and master.backup.secretName set (or give --strata-namespace)", key.Namespace, key.Name)
		}
		return fmt.Errorf("reading the ConfigMap %s/%s: %w", key.Namespace, key.Name, err)
	}
	token := time.Now().UTC().Format(time.RFC3339Nano)
	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[datav1alpha1.AnnotationBackupRequested] = token
	if err := c.Client.Patch(ctx, cm, patch); err != nil {
		return fmt.Errorf("annotating the ConfigMap %s/%s with %s: %w", key.Namespace, key.Name, datav1alpha1.AnnotationBackupRequested, err)
	}
	c.printf("asked for a backup of the master to %s; waiting for it…\n", cm.Data[datav1alpha1.BackupKeyStore])
	cm, err := awaitObject(ctx, c, cm, &corev1.ConfigMapList{}, func(cm *corev1.ConfigMap) (bool, error) {
		return cm.Data[datav1alpha1.BackupKeyHandled] == token, nil
	}, func(ctx context.Context, last *corev1.ConfigMap, cause error) error {
		if ctx.Err() == nil {
			return fmt.Errorf("waiting for the backup: %w", cause)
		}
		why := ""
		if failure := last.Data[datav1alpha1.BackupKeyFailure]; failure != "" {
			why = fmt.Sprintf("; the operator's last failure (%s): %s", last.Data[datav1alpha1.BackupKeyFailureTime], failure)
		}
		return fmt.Errorf("%w within %s: is the operator running? `kubectl get pods -n %s -l app.kubernetes.io/component=operator`; its events: `kubectl get events -n %s --field-selector involvedObject.name=%s`%s",
			errNoAnswer, c.wait(), key.Namespace, key.Namespace, key.Name, why)
	})
	if err != nil {
		return err
	}
	if cm.Data[datav1alpha1.BackupKeyResult] != datav1alpha1.BackupSucceeded {
		return errors.New("the backup failed: " + cm.Data[datav1alpha1.BackupKeyFailure])
	}
	size, _ := strconv.ParseInt(cm.Data[datav1alpha1.BackupKeyLastBytes], 10, 64)
	c.printf("backed up: %s/%s, %s, up to Raft index %s\n", cm.Data[datav1alpha1.BackupKeyStore], cm.Data[datav1alpha1.BackupKeyLast], humanize.Bytes(size), cm.Data[datav1alpha1.BackupKeyLastIndex])
	return nil
}
