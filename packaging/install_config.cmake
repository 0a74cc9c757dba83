# `cmake --install` step for the configuration file: installed only where
# none is (a reinstall from source must not replace the operator's edited
# file). XDPQ_CONF_SRC and XDPQ_CONF_DIR come from the install(CODE) before.
# file(INSTALL) puts DESTDIR in front of the destination itself; the check
# must do it by hand.
if(EXISTS "$ENV{DESTDIR}${XDPQ_CONF_DIR}/xdpq.toml")
  message(STATUS "Kept: $ENV{DESTDIR}${XDPQ_CONF_DIR}/xdpq.toml (the defaults: xdpqd --print-default-config)")
else()
  file(INSTALL "${XDPQ_CONF_SRC}" DESTINATION "${XDPQ_CONF_DIR}")
endif()
