"""Deployment artefacts derived from the repository's single sources (`manifests`), and the
`specproxy deploy` command that writes them (`cli`)."""
