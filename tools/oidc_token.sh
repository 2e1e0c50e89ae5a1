#!/usr/bin/env bash
# The GitHub Actions job's OIDC token for audience `sigstore`, on stdout: what Fulcio certifies
# and what `builder publish` / `builder attest` read from SIGSTORE_ID_TOKEN (keyless signing,
# no private key). The job needs `id-token: write`, which makes the runner set
# ACTIONS_ID_TOKEN_REQUEST_URL and ACTIONS_ID_TOKEN_REQUEST_TOKEN; where they are not set (a
# runner without GitHub's OIDC) it prints nothing and says so on stderr: builder then signs
# with the key alone, or refuses to publish unsigned.
#   SIGSTORE_ID_TOKEN="$(tools/oidc_token.sh)"
set -euo pipefail
if [ -z "${ACTIONS_ID_TOKEN_REQUEST_URL:-}" ] || [ -z "${ACTIONS_ID_TOKEN_REQUEST_TOKEN:-}" ]; then
  echo "::warning::no OIDC token (the job needs permissions: id-token: write): keyless signing off" >&2
  exit 0
fi
curl -fsS --retry 3 -H "Authorization: bearer $ACTIONS_ID_TOKEN_REQUEST_TOKEN" \
  "${ACTIONS_ID_TOKEN_REQUEST_URL}&audience=sigstore" | jq -er '.value'
