//! Regenerates the driver bindings from `cuda.h` when a header and libclang are present.
//!
//! The crate always compiles the committed files `src/bindings.rs` (types and constants)
//! and `src/driver_api.rs` (the fallible function table and the error table), so it builds
//! where no toolkit exists. When a header is found, the files are generated again into
//! `OUT_DIR` and compared with the committed ones:
//! - `CUDA_SYS_WRITE_BINDINGS=1` writes the fresh files over the committed ones;
//! - `CUDA_SYS_CHECK_BINDINGS=1` fails the build if they differ (CI's drift check) or if no
//!   header or libclang was found;
//! - otherwise a difference is a warning.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    for var in [
        "CUDA_PATH",
        "CUDA_HOME",
        "CUDA_SYS_WRITE_BINDINGS",
        "CUDA_SYS_CHECK_BINDINGS",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let check = env::var("CUDA_SYS_CHECK_BINDINGS").is_ok_and(|v| v == "1");
    let write = env::var("CUDA_SYS_WRITE_BINDINGS").is_ok_and(|v| v == "1");

    let Some(include) = find_cuda_include(&manifest) else {
        if check {
            panic!("CUDA_SYS_CHECK_BINDINGS=1 but no cuda.h was found (CUDA_PATH, CUDA_HOME, /usr/local/cuda, .toolchain)");
        }
        println!("cargo:warning=cuda.h not found: using the committed bindings as they are");
        return;
    };
    println!(
        "cargo:rerun-if-changed={}",
        include.join("cuda.h").display()
    );

    let generated = std::panic::catch_unwind(|| generate_raw(&manifest, &include));
    let raw = match generated {
        Ok(Ok(raw)) => raw,
        Ok(Err(e)) => fail_or_warn(check, &format!("bindgen failed: {e}")),
        Err(_) => fail_or_warn(check, "libclang could not be loaded; install libclang-dev"),
    };
    let (bindings, driver_api) = split_and_generate(&raw);

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut drift = Vec::new();
    for (name, text) in [("bindings.rs", &bindings), ("driver_api.rs", &driver_api)] {
        fs::write(out.join(name), text).expect("write into OUT_DIR");
        let committed_path = manifest.join("src").join(name);
        let committed = fs::read_to_string(&committed_path).unwrap_or_default();
        if &committed != text {
            if write {
                fs::write(&committed_path, text).expect("write committed bindings");
                println!("cargo:warning=updated {}", committed_path.display());
            } else {
                drift.push(name);
            }
        }
    }
    if !drift.is_empty() {
        let msg = format!(
            "the bindings generated from {} differ from the committed {:?}; \
             run with CUDA_SYS_WRITE_BINDINGS=1 to update them",
            include.display(),
            drift
        );
        if check {
            panic!("{msg}");
        }
        println!("cargo:warning={msg}");
    }
}

fn fail_or_warn(check: bool, msg: &str) -> ! {
    if check {
        panic!("{msg}");
    }
    println!("cargo:warning={msg}; using the committed bindings as they are");
    std::process::exit(0);
}

/// The first folder holding `cuda.h` among the places the README lists.
fn find_cuda_include(manifest: &Path) -> Option<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(v) = env::var_os(var) {
            roots.push(PathBuf::from(v));
        }
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    let toolchain = manifest.join("../.toolchain/site/nvidia");
    roots.push(toolchain.join("cu13"));
    roots.push(toolchain.join("cuda_runtime"));
    roots
        .into_iter()
        .map(|r| r.join("include"))
        .find(|inc| inc.join("cuda.h").is_file())
}

fn generate_raw(manifest: &Path, include: &Path) -> Result<String, String> {
    bindgen::Builder::default()
        .header(manifest.join("wrapper.h").to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("cu[A-Z].*")
        .allowlist_type("CU.*|cu[a-z].*")
        .allowlist_var("CU.*")
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .layout_tests(false)
        .generate_comments(true)
        .size_t_is_usize(true)
        .formatter(bindgen::Formatter::None)
        .generate()
        .map(|b| b.to_string())
        .map_err(|e| e.to_string())
}

const HEADER: &str =
    "// @generated by cuda-sys/build.rs from cuda.h with bindgen. Do not edit by hand.\n";

/// Splits bindgen's output into types/constants and the function table.
fn split_and_generate(raw: &str) -> (String, String) {
    let file = syn::parse_file(raw).expect("bindgen output parses");
    let mut type_items = Vec::new();
    let mut functions = Vec::new();
    let mut errors: Vec<(String, u32, String)> = Vec::new();
    for item in file.items {
        match item {
            syn::Item::ForeignMod(fm) => {
                for fi in fm.items {
                    match fi {
                        syn::ForeignItem::Fn(f) => functions.push(f),
                        other => panic!("unexpected foreign item: {}", quote!(#other)),
                    }
                }
            }
            syn::Item::Impl(ref imp) if is_type(&imp.self_ty, "cudaError_enum") => {
                collect_errors(imp, &mut errors);
                type_items.push(item);
            }
            other => type_items.push(other),
        }
    }
    let bindings = syn::File {
        shebang: None,
        attrs: Vec::new(),
        items: type_items,
    };
    let bindings = format!("{HEADER}{}", prettyplease::unparse(&bindings));

    functions.sort_by_key(|f| f.sig.ident.to_string());
    let api = driver_api_tokens(&functions, &errors);
    let api: syn::File = syn::parse2(api).expect("generated table parses");
    (bindings, format!("{HEADER}{}", prettyplease::unparse(&api)))
}

fn is_type(ty: &syn::Type, name: &str) -> bool {
    matches!(ty, syn::Type::Path(p) if p.path.is_ident(name))
}

fn doc_text(attrs: &[syn::Attribute]) -> String {
    let mut text = String::new();
    for a in attrs {
        if let syn::Meta::NameValue(nv) = &a.meta {
            if nv.path.is_ident("doc") {
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = &nv.value
                {
                    let _ = write!(text, " {}", s.value());
                }
            }
        }
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn collect_errors(imp: &syn::ItemImpl, out: &mut Vec<(String, u32, String)>) {
    for it in &imp.items {
        let syn::ImplItem::Const(c) = it else {
            continue;
        };
        // `pub const NAME: cudaError_enum = cudaError_enum(N);`
        let syn::Expr::Call(call) = &c.expr else {
            continue;
        };
        let Some(syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(n),
            ..
        })) = call.args.first()
        else {
            continue;
        };
        let code: u32 = n.base10_parse().expect("error code is an integer");
        out.push((c.ident.to_string(), code, doc_text(&c.attrs)));
    }
}

/// The API name a versioned symbol stands for: `cuMemAlloc_v2` is `cuMemAlloc`.
fn api_name(symbol: &str) -> &str {
    if let Some(pos) = symbol.rfind("_v") {
        let suffix = &symbol[pos + 2..];
        if !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()) {
            return &symbol[..pos];
        }
    }
    symbol
}

fn driver_api_tokens(
    functions: &[syn::ForeignItemFn],
    errors: &[(String, u32, String)],
) -> TokenStream {
    let mut names_seen = std::collections::HashMap::<String, usize>::new();
    for f in functions {
        *names_seen
            .entry(api_name(&f.sig.ident.to_string()).to_string())
            .or_default() += 1;
    }
    let mut fields = Vec::new();
    let mut inits = Vec::new();
    let mut methods = Vec::new();
    let mut symbol_list = Vec::new();
    for f in functions {
        let symbol = f.sig.ident.to_string();
        let api = api_name(&symbol);
        // A versioned name whose base is also declared keeps its own name.
        let method_name = if names_seen[api] == 1 {
            api
        } else {
            symbol.as_str()
        };
        let field = &f.sig.ident;
        let method = Ident::new(method_name, Span::call_site());
        let inputs = &f.sig.inputs;
        let output = &f.sig.output;
        let ret_ty: syn::Type = match output {
            syn::ReturnType::Default => syn::parse_quote!(()),
            syn::ReturnType::Type(_, t) => (**t).clone(),
        };
        let arg_names: Vec<_> = inputs
            .iter()
            .map(|a| match a {
                syn::FnArg::Typed(p) => p.pat.clone(),
                syn::FnArg::Receiver(_) => panic!("receiver in a C function"),
            })
            .collect();
        let arg_types: Vec<_> = inputs
            .iter()
            .map(|a| match a {
                syn::FnArg::Typed(p) => p.ty.clone(),
                syn::FnArg::Receiver(_) => unreachable!(),
            })
            .collect();
        let sym_lit = syn::LitCStr::new(
            &std::ffi::CString::new(symbol.clone()).expect("symbol has no NUL"),
            Span::call_site(),
        );
        let doc = format!(
            " Calls `{symbol}` (the header's `{api}`); `MissingSymbol` if the loaded driver lacks it.\n\n \
             # Safety\n Same contract as the C function: pointers must be valid for what the driver reads and writes."
        );
        fields.push(quote! {
            #field: Option<unsafe extern "C" fn(#(#arg_types),*) #output>
        });
        inits.push(quote! {
            // SAFETY: `resolve` returns the address of the symbol of exactly this name, whose
            // C signature is the one cuda.h declares for it; null becomes `None`.
            #field: unsafe { core::mem::transmute::<*mut core::ffi::c_void, Option<unsafe extern "C" fn(#(#arg_types),*) #output>>(resolve(#sym_lit)) }
        });
        let is_result = matches!(&ret_ty, syn::Type::Path(p) if p.path.is_ident("CUresult"));
        let body = if is_result {
            quote! {
                match self.#field {
                    Some(driver_fn__) => {
                        crate::fault::before(#symbol)?;
                        crate::fault::after(#symbol, crate::error::check(driver_fn__(#(#arg_names),*), #symbol))
                    }
                    None => Err(crate::error::Error::MissingSymbol { symbol: #symbol }),
                }
            }
        } else {
            quote! {
                match self.#field {
                    Some(driver_fn__) => Ok(driver_fn__(#(#arg_names),*)),
                    None => Err(crate::error::Error::MissingSymbol { symbol: #symbol }),
                }
            }
        };
        let ok_ty: syn::Type = if is_result {
            syn::parse_quote!(())
        } else {
            ret_ty.clone()
        };
        methods.push(quote! {
            #[doc = #doc]
            #[inline]
            pub unsafe fn #method(&self, #inputs) -> Result<#ok_ty, crate::error::Error> {
                #body
            }
        });
        symbol_list.push(symbol.clone());
    }
    let error_arms = errors.iter().map(|(name, code, desc)| {
        quote! { #code => Some((#name, #desc)) }
    });
    let count = symbol_list.len();
    let present_checks = functions.iter().map(|f| {
        let field = &f.sig.ident;
        let symbol = field.to_string();
        quote! { (#symbol, self.#field.is_some()) }
    });
    let table_ident = format_ident!("DriverApi");
    quote! {
        #![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments, clippy::type_complexity)]
        use crate::bindings::*;

        /// The names of every driver entry point `cuda.h` declares, as exported by `libcuda`.
        pub const SYMBOLS: [&str; #count] = [#(#symbol_list),*];

        /// Every driver entry point of `cuda.h`, resolved at load time under the versioned
        /// name the header maps it to. A symbol the driver lacks is `None`, and calling it
        /// returns [`Error::MissingSymbol`](crate::Error::MissingSymbol).
        pub struct #table_ident {
            #(#fields,)*
        }

        impl #table_ident {
            /// Builds the table with `resolve`, which returns a symbol's address or null.
            pub(crate) fn resolve(mut resolve: impl FnMut(&core::ffi::CStr) -> *mut core::ffi::c_void) -> Self {
                Self { #(#inits,)* }
            }

            /// Whether each symbol of [`SYMBOLS`] was found, in the same order.
            pub fn presence(&self) -> [(&'static str, bool); #count] {
                [#(#present_checks),*]
            }

            #(#methods)*
        }

        /// The header's name and description for a `CUresult` code.
        pub(crate) fn error_info(code: u32) -> Option<(&'static str, &'static str)> {
            match code {
                #(#error_arms,)*
                _ => None,
            }
        }
    }
}
