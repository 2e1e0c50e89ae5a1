#!/usr/bin/env bash
# Keyless signatures beside the key's: the workflow's GitHub OIDC identity (Fulcio certificate,
# Rekor entry) signs the index and every platform manifest of the variant's latest publication,
# and attests the same three documents `builder publish` attested with the key (provenance,
# SBOM, smoke report). build.yml and rebuild.yml both run this, so an image they publish passes
# the same keyless admission policy. Needs cosign on PATH and `id-token: write`.
#   tools/sign_keyless.sh VARIANT_ID REPORT   (REPORT: `builder publish --manifest REPORT`)
set -euo pipefail
variant="$1"
report="$2"
if [ ! -f "$report" ] || ! jq -e --arg id "$variant" '.variants[$id]' "$report" > /dev/null; then
  echo "nothing published for $variant in this run: nothing to sign keyless"
  exit 0
fi
ref="$(jq -r --arg id "$variant" '.variants[$id].publications[-1].reference' "$report")"
cosign sign --yes --recursive "$ref"
digests="$(jq -r --arg id "$variant" '.variants[$id].publications[-1]
  | [.platforms[]?.digest] | if length == 0 then empty else .[] end' "$report")"
for digest in ${digests:-${ref#*@}}; do
  platform_ref="${ref%@*}@$digest"
  # The key's attestations, when the repository keeps a key; without one builder published the
  # three documents as sigstore bundles already (referrers), so there is nothing to copy here.
  if ! cosign download attestation "$platform_ref" > envelopes.json 2> /dev/null \
      || [ ! -s envelopes.json ]; then
    echo "no key attestations on $platform_ref: its sigstore bundles stand"
    continue
  fi
  for type in https://slsa.dev/provenance/v1 https://cyclonedx.org/bom \
      https://github.com/torch-images/torch-images/smoke-report/v1; do
    jq -r '.payload' envelopes.json | base64 -d \
      | jq -c --arg t "$type" 'select(.predicateType == $t) | .predicate' \
      | head -n 1 > predicate.json
    cosign attest --yes --type "$type" --predicate predicate.json "$platform_ref"
  done
done
