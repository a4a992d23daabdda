#!/usr/bin/env bash
# PDFs of other documents, e.g. labelled pages for the detection heads (`detect_extra_pdfs`; EXTRA_PDFS=DIR of
# tools/experiments/real_pages_bench.sh): the PDFs of two more Debian texlive documentation packages, unpacked into a folder
# without installing them (so /usr/share/doc/texlive-doc, the long benchmark's own split, stays as it is).
#   texlive-latex-recommended-doc (~50 MB) and texlive-science-doc (~84 MB): 483 LaTeX-typeset PDFs, none of
#   them a file of texlive-latex-base-doc; 8 pages of each hold ~540 tables and ~990 figures by the PDF builder's
#   labels, where the benchmark's 185 training documents hold 98 and 67. Measured as the heads' extra pages they
#   cost held-out detection (docs/learning.md, "Labelled pages of other documents for the head").
# Usage: bash tools/experiments/fetch_extra_pdfs.sh [DIR]   (default .cache/texlive-extra-pdfs); prints the PDF folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.cache/texlive-extra-pdfs}
PACKAGES="texlive-latex-recommended-doc texlive-science-doc"
PDFS="$DIR/usr/share/doc/texlive-doc"
if [ -f "$DIR/.complete" ]; then echo "$PDFS"; exit 0; fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || {
  echo "[extra pdfs] needs apt-get and dpkg-deb (Debian/Ubuntu); set EXTRA_PDFS=DIR to a folder of PDFs instead" >&2; exit 3; }
mkdir -p "$DIR/debs"
# apt-get download needs package lists; as root they are refreshed once (setup scripts run as root)
if [ "$(id -u)" = "0" ] && ! apt-cache show texlive-science-doc >/dev/null 2>&1; then apt-get update -qq; fi
( cd "$DIR/debs" && apt-get download $PACKAGES ) >&2 || {
  echo "[extra pdfs] apt-get download $PACKAGES failed (no package lists or no registry)" >&2; exit 3; }
for deb in "$DIR"/debs/*.deb; do dpkg-deb -x "$deb" "$DIR"; done
rm -rf "$DIR/debs"
find "$DIR" -type f ! -name "*.pdf" -delete  # the folder holds PDFs only: other files would be recorded skips
touch "$DIR/.complete"
echo "[extra pdfs] $(find "$PDFS" -name '*.pdf' | wc -l) PDFs in $PDFS" >&2
echo "$PDFS"
