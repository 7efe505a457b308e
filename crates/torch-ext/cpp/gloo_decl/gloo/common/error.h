// Declarations only; see gloo_decl/README.md.
#pragma once
