// Test support for scripts/check_apple_build.sh (not part of any build):
// force-included (-include) so that the macOS 14.2 SDK's headers report a
// macOS 15 SDK, the way a real 15 SDK's AvailabilityInternal.h does:
// __MAC_OS_X_VERSION_MAX_ALLOWED is the SDK's version, MIN_REQUIRED the
// deployment target (from --target / -mmacosx-version-min). The SDK's own
// definitions sit under #ifndef __MAC_OS_X_VERSION_MIN_REQUIRED, so these win.
// The residency-set declarations that a 15 SDK adds are in Metal/ beside this
// file (generated from metal-cpp by tests/apple/gen_sdk15_overlay.py).
#pragma once

#if defined(__ENVIRONMENT_OS_VERSION_MIN_REQUIRED__)
#define __MAC_OS_X_VERSION_MIN_REQUIRED __ENVIRONMENT_OS_VERSION_MIN_REQUIRED__
#elif defined(__ENVIRONMENT_MAC_OS_X_VERSION_MIN_REQUIRED__)
#define __MAC_OS_X_VERSION_MIN_REQUIRED __ENVIRONMENT_MAC_OS_X_VERSION_MIN_REQUIRED__
#else
#error "sdk15_prefix.h: not compiling for a macOS target"
#endif
#define __MAC_OS_X_VERSION_MAX_ALLOWED 150000
#define __MAC_15_0 150000
#define __IPHONE_18_0 180000
