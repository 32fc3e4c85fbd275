# Sourced by the engines' set-up scripts: apt_install PACKAGE... installs what is missing,
# quietly. Other set-up scripts may be installing at the same moment: it waits for dpkg's lock
# rather than fail.
apt_install() {
  (($#)) || return 0
  say "installing $*"
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=600 -y -qq \
    --no-install-recommends "$@" >/dev/null
}
