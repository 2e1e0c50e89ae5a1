#!/usr/bin/env bash
# The workflow identities the pipeline trusts keylessly, as one full-match regular expression
# for --certificate-identity-regexp (with --certificate-oidc-issuer
# https://token.actions.githubusercontent.com): this repository's build.yml and rebuild.yml on
# main, the subjects of the Fulcio certificates their jobs sign with. Staged evidence, the
# registry's publications and `builder verify` in CI trust exactly these.
#   builder publish --certificate-identity-regexp "$(tools/trusted_identity.sh)" …
set -euo pipefail
: "${GITHUB_REPOSITORY:?GITHUB_REPOSITORY (owner/repo) is not set}"
printf 'https://github\\.com/%s/\\.github/workflows/(build|rebuild)\\.yml@refs/heads/main\n' \
  "${GITHUB_REPOSITORY//./\\.}"
