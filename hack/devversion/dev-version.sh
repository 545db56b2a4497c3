#!/usr/bin/env bash
# Prints the tag of the images built from this tree: BASE-dev.COMMIT, and .CHANGES (a hash of the
# uncommitted changes and of the files not yet added) when the tree differs from its commit. A
# tree that changed gets a tag of its own, so that `make deploy` after an edit deploys new images:
# with the tag of the images running, Helm and the operator would change nothing, and no pod
# would restart. Outside a git checkout it prints BASE.
#
# Usage: hack/devversion/dev-version.sh BASE   e.g. hack/devversion/dev-version.sh 0.1.0
set -euo pipefail

base=${1:?usage: dev-version.sh BASE}
if ! commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
  echo "$base"
  exit 0
fi
untracked=$(git ls-files --others --exclude-standard)
if git diff --quiet HEAD -- && [ -z "$untracked" ]; then
  echo "$base-dev.$commit"
  exit 0
fi
changes=$({
  git diff --binary HEAD --
  # Names and contents of the files not added yet.
  git ls-files --others --exclude-standard -z | xargs -0 -r sha256sum --
} | sha256sum | cut -c1-12)
echo "$base-dev.$commit.$changes"
