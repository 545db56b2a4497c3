package controllers

import (
	"strings"
	"testing"
	"time"
)

func TestMasterBackupSpecSaysWhichFlagToFix(t *testing.T) {
	good := MasterBackupSpec{URI: "s3://bucket/backups", SecretName: "keys"}
	for name, tc := range map[string]struct {
		mutate func(*MasterBackupSpec)
		want   string // empty: valid
	}{
		"no backups":                 {mutate: func(s *MasterBackupSpec) { *s = MasterBackupSpec{} }},
		"on request":                 {mutate: func(*MasterBackupSpec) {}},
		"every six hours, restored":  {mutate: func(s *MasterBackupSpec) { s.Every, s.RestoreFrom = 6*time.Hour, RestoreLatest }},
		"a named backup":             {mutate: func(s *MasterBackupSpec) { s.RestoreFrom = "strata-master-20261130T020000Z.backup" }},
		"a restore without a store":  {mutate: func(s *MasterBackupSpec) { *s = MasterBackupSpec{RestoreFrom: RestoreLatest} }, want: "need --master-backup-uri"},
		"a schedule without a store": {mutate: func(s *MasterBackupSpec) { *s = MasterBackupSpec{Every: time.Hour} }, want: "need --master-backup-uri"},
		"not S3":                     {mutate: func(s *MasterBackupSpec) { s.URI = "file:///backups" }, want: "give s3://bucket/prefix"},
		"no keys":                    {mutate: func(s *MasterBackupSpec) { s.SecretName = "" }, want: "--master-backup-secret is required"},
		"too often":                  {mutate: func(s *MasterBackupSpec) { s.Every = time.Second }, want: "at least 1m"},
		"a path, not a name":         {mutate: func(s *MasterBackupSpec) { s.RestoreFrom = "../x.backup" }, want: `give "latest" or a backup's name`},
	} {
		t.Run(name, func(t *testing.T) {
			spec := good
			tc.mutate(&spec)
			err := spec.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
