//! Settings described once. A configuration (`TrainConfig`, its sub-configuration
//! `WeightConfig`) is declared with [`settings!`]: each field together with its flag, its
//! help, who must agree on it ([`Scope`]) and what the job service does with it
//! ([`ServiceRole`]). From that one declaration come the struct, its defaults, the
//! [`Setting`] table (`SETTINGS`), [`set`](crate::train::TrainConfig::set) (a field from its
//! command-line values) and `show` (a field as a user would type it). The command line
//! builds its flags from the table, the cross-rank and resume checks list the table's
//! `Agreed`/`Resumed` settings, and the service derives which flags a job spec carries: a
//! new field cannot be added without saying where it goes.
//!
//! Values are read and written through [`SettingValue`]: numbers, switches, paths, lists,
//! options and the option enums (every [`Word`]). `show` writes what a user would type
//! (`10`, `none`, `256,128`, a path), and [`NOT_SET`] for an option that was not given.

use std::path::PathBuf;

/// What [`SettingValue::show`] writes for an option that was not given.
pub const NOT_SET: &str = "(not set)";

/// How a setting is written on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// A switch: given or not (`--shuffle`).
    Switch,
    /// One value (`--batch 1024`).
    Value,
    /// One value, or not given (`--max-steps 10`).
    Optional,
    /// Values separated by commas, or the flag repeated (`--hidden 256,128`).
    List,
    /// The flag repeated, one value each; commas are part of the value (`--day-of a=3`).
    Repeated,
}

/// Who must agree on a setting's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every rank starts with the same value, and a resumed run repeats it (a checkpoint
    /// records it).
    Resumed,
    /// Every rank starts with the same value; a resumed run may change it.
    Agreed,
    /// Each rank may have its own value; the reason.
    Free(&'static str),
}

/// What the job service (`ringrec serve`) does with a `ringrec train` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceRole {
    /// A typed field of the job spec carries it (the field's name); `args` may not.
    Typed(&'static str),
    /// The service sets it for every job (or it has no place in a job); never in a spec.
    Owned,
    /// A spec may give it among its extra `args`.
    Args,
    /// A spec may not ask for it; the reason.
    Refused(&'static str),
}

/// One setting: a field of a configuration and everything said about it.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The field's name.
    pub field: &'static str,
    /// Its flag, `--name`.
    pub flag: &'static str,
    /// The placeholder of its value in the help (`N`, `PATH`); empty for a switch.
    pub value_name: &'static str,
    /// The help text (the field's doc comment).
    pub help: &'static str,
    /// How it is written on the command line.
    pub arity: Arity,
    /// The environment variable that gives its value when the flag is not given.
    pub env: Option<&'static str>,
    /// Who must agree on it.
    pub scope: Scope,
    /// What the job service does with it.
    pub service: ServiceRole,
    /// Checks one command-line value (an item of a list), saying what is wrong.
    pub check: fn(&str) -> Result<(), String>,
}

impl Setting {
    /// The flag without its dashes (clap's `long`).
    pub fn long(&self) -> &'static str {
        self.flag.trim_start_matches('-')
    }

    /// The help's first paragraph on one line.
    pub fn summary(&self) -> String {
        self.help.split("\n\n").next().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// A value a setting can hold: read from its command-line values, shown as typed.
pub trait SettingValue: Sized {
    /// How it is written on the command line.
    const ARITY: Arity;
    /// The value from its command-line values (none for a switch that was given; one for a
    /// value; the items of a list).
    fn from_values(values: &[&str]) -> Result<Self, String>;
    /// The value as a user would type it.
    fn show(&self) -> String;
}

/// A value written as one word: numbers, paths and the option enums.
pub trait Word: Sized {
    /// Parses one word, saying what is accepted when it is not.
    fn parse_word(s: &str) -> Result<Self, String>;
    /// The word.
    fn word(&self) -> String;
}

/// The one value of `values` (a setting of arity `Value` or `Optional`).
pub fn one<'a>(values: &[&'a str]) -> Result<&'a str, String> {
    match values {
        [v] => Ok(v),
        _ => Err(format!("expected one value, got {}", values.len())),
    }
}

macro_rules! number_words {
    ($($t:ty => $what:literal),+ $(,)?) => {$(
        impl Word for $t {
            fn parse_word(s: &str) -> Result<$t, String> {
                s.trim().parse::<$t>().map_err(|_| format!("`{s}` is not {}", $what))
            }
            fn word(&self) -> String {
                self.to_string()
            }
        }
    )+};
}

number_words!(u32 => "a whole number >= 0", u64 => "a whole number >= 0", usize => "a whole number >= 0", f32 => "a number", f64 => "a number");

impl Word for PathBuf {
    fn parse_word(s: &str) -> Result<PathBuf, String> {
        if s.is_empty() {
            return Err("an empty path".into());
        }
        Ok(PathBuf::from(s))
    }
    fn word(&self) -> String {
        self.display().to_string()
    }
}

/// A name (a column's): any non-empty word.
impl Word for String {
    fn parse_word(s: &str) -> Result<String, String> {
        if s.is_empty() {
            return Err("an empty name".into());
        }
        Ok(s.to_string())
    }
    fn word(&self) -> String {
        self.clone()
    }
}

/// Every [`Word`] type (except the list items below) is a setting of one value.
macro_rules! word_settings {
    ($($t:ty),+ $(,)?) => {$(
        impl $crate::settings::SettingValue for $t {
            const ARITY: $crate::settings::Arity = $crate::settings::Arity::Value;
            fn from_values(values: &[&str]) -> Result<$t, String> {
                <$t as $crate::settings::Word>::parse_word($crate::settings::one(values)?)
            }
            fn show(&self) -> String {
                $crate::settings::Word::word(self)
            }
        }
    )+};
}
pub(crate) use word_settings;

word_settings!(u32, u64, usize, f32, f64, PathBuf, String);

impl SettingValue for bool {
    const ARITY: Arity = Arity::Switch;
    fn from_values(values: &[&str]) -> Result<bool, String> {
        match values {
            [] => Ok(true),
            [v] => match v.trim() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(format!("`{v}` is not true or false")),
            },
            _ => Err(format!("expected at most one value, got {}", values.len())),
        }
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl<T: SettingValue> SettingValue for Option<T> {
    const ARITY: Arity = Arity::Optional;
    fn from_values(values: &[&str]) -> Result<Option<T>, String> {
        T::from_values(values).map(Some)
    }
    fn show(&self) -> String {
        self.as_ref().map_or_else(|| NOT_SET.to_string(), T::show)
    }
}

/// Lists of [`Word`]s of arity `List` or `Repeated`, shown comma-separated.
macro_rules! list_settings {
    ($($t:ty => $arity:expr),+ $(,)?) => {$(
        impl $crate::settings::SettingValue for Vec<$t> {
            const ARITY: $crate::settings::Arity = $arity;
            fn from_values(values: &[&str]) -> Result<Vec<$t>, String> {
                values.iter().map(|v| <$t as $crate::settings::Word>::parse_word(v)).collect()
            }
            fn show(&self) -> String {
                self.iter().map($crate::settings::Word::word).collect::<Vec<_>>().join(",")
            }
        }
    )+};
}

pub(crate) use list_settings;

list_settings!(usize => Arity::List, PathBuf => Arity::List, String => Arity::List);

/// Makes an option enum with `parse(&str) -> Option<Self>` and `name()` a [`Word`] and a
/// setting of one value; the error names `$what` and lists `$choices`.
macro_rules! word_enum {
    ($t:ty, $what:literal, $choices:literal) => {
        impl $crate::settings::Word for $t {
            fn parse_word(s: &str) -> Result<$t, String> {
                <$t>::parse(s).ok_or_else(|| format!("`{s}` is not a {}; choose from {}", $what, $choices))
            }
            fn word(&self) -> String {
                self.to_string()
            }
        }
        $crate::settings::word_settings!($t);
    };
}
pub(crate) use word_enum;

/// `$a` if given, else `$b`: a declaration's optional override of a default function.
#[doc(hidden)]
macro_rules! first_of {
    ($a:expr, $b:expr) => {
        $a
    };
    ($b:expr) => {
        $b
    };
}
pub(crate) use first_of;

/// Declares a configuration struct and its settings (see the module docs). Each field:
///
/// ```text
/// /// Its doc comment: the flag's help.
/// #[setting(flag = "--name", scope = Scope::Agreed, service = ServiceRole::Args
///           [, value_name = "N"] [, env = "RINGREC_THREADS"] [, parse = FN] [, show = FN])]
/// pub name: Type = default,
/// ```
///
/// `parse` (`fn(&[&str]) -> Result<Type, String>`) and `show` (`fn(&Type) -> String`)
/// replace [`SettingValue`]'s where a setting spells its values its own way (`--backend
/// auto`). After the struct, `nested { pub name: Type, }` lists fields that are
/// configurations declared the same way, whose settings are this one's too
/// (`all_settings`, `set`, `show` reach into them).
macro_rules! settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                #[setting(flag = $flag:literal, scope = $scope:expr, service = $service:expr
                    $(, value_name = $vn:literal)? $(, env = $env:literal)? $(, parse = $parse:expr)? $(, show = $show:expr)? $(,)?)]
                pub $field:ident : $ty:ty = $default:expr,
            )+
        }
        $(nested {
            $(
                $(#[doc = $sdoc:literal])*
                pub $sfield:ident : $sty:ty,
            )+
        })?
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[doc = $doc])*
                pub $field: $ty,
            )+
            $($(
                $(#[doc = $sdoc])*
                pub $sfield: $sty,
            )+)?
        }

        impl $name {
            /// The settings of this configuration's own fields, in declaration order.
            pub const SETTINGS: &'static [$crate::settings::Setting] = &[$(
                $crate::settings::Setting {
                    field: stringify!($field),
                    flag: $flag,
                    value_name: $crate::settings::first_of!($($vn,)? ""),
                    help: concat!($($doc, "\n"),+),
                    arity: <$ty as $crate::settings::SettingValue>::ARITY,
                    env: $crate::settings::first_of!($(Some($env),)? None),
                    scope: $scope,
                    service: $service,
                    check: |s: &str| {
                        let parse: fn(&[&str]) -> Result<$ty, String> = $crate::settings::first_of!($($parse,)? <$ty as $crate::settings::SettingValue>::from_values);
                        parse(&[s]).map(|_| ())
                    },
                },
            )+];

            /// Every setting: this configuration's own, then its nested configurations'.
            pub fn all_settings() -> Vec<&'static $crate::settings::Setting> {
                #[allow(unused_mut)]
                let mut all: Vec<&'static $crate::settings::Setting> = Self::SETTINGS.iter().collect();
                $($(all.extend(<$sty>::all_settings());)+)?
                all
            }

            /// Every setting at its default.
            pub fn defaults() -> $name {
                $name { $($field: $default,)+ $($($sfield: <$sty>::defaults(),)+)? }
            }

            /// Sets `field` (of this configuration or a nested one) from its command-line
            /// values (see [`SettingValue`]); `Ok(false)` when there is no such field.
            pub fn set(&mut self, field: &str, values: &[&str]) -> Result<bool, String> {
                match field {
                    $(stringify!($field) => {
                        let parse: fn(&[&str]) -> Result<$ty, String> = $crate::settings::first_of!($($parse,)? <$ty as $crate::settings::SettingValue>::from_values);
                        self.$field = parse(values)?;
                        Ok(true)
                    })+
                    _ => {
                        $($(if self.$sfield.set(field, values)? {
                            return Ok(true);
                        })+)?
                        Ok(false)
                    }
                }
            }

            /// `field`'s value (of this configuration or a nested one) as a user would type
            /// it; `None` when there is no such field.
            pub fn show(&self, field: &str) -> Option<String> {
                match field {
                    $(stringify!($field) => {
                        let show: fn(&$ty) -> String = $crate::settings::first_of!($($show,)? <$ty as $crate::settings::SettingValue>::show);
                        Some(show(&self.$field))
                    })+
                    _ => {
                        $($(if let Some(v) = self.$sfield.show(field) {
                            return Some(v);
                        })+)?
                        None
                    }
                }
            }
        }
    };
}
pub(crate) use settings;

#[cfg(test)]
mod tests {
    use super::*;

    settings! {
        /// A test configuration.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Example {
            /// Rows.
            ///
            /// More words.
            #[setting(flag = "--rows", scope = Scope::Resumed, service = ServiceRole::Typed("rows"), value_name = "N")]
            pub rows: u64 = 5,
            /// Widths.
            #[setting(flag = "--widths", scope = Scope::Agreed, service = ServiceRole::Args)]
            pub widths: Vec<usize> = vec![2, 3],
            /// A limit.
            #[setting(flag = "--limit", scope = Scope::Free("why"), service = ServiceRole::Args, env = "RINGREC_EXAMPLE")]
            pub limit: Option<f64> = None,
            /// A switch.
            #[setting(flag = "--on", scope = Scope::Agreed, service = ServiceRole::Owned)]
            pub on: bool = false,
            /// Spelled its own way.
            #[setting(flag = "--mode", scope = Scope::Agreed, service = ServiceRole::Args, parse = |v: &[&str]| match one(v)? { "auto" => Ok(None), s => u32::parse_word(s).map(Some) }, show = |m: &Option<u32>| m.map_or("auto".into(), |m| m.to_string()))]
            pub mode: Option<u32> = None,
        }
    }

    #[test]
    fn the_table_follows_the_declaration() {
        let s = Example::SETTINGS;
        assert_eq!(s.iter().map(|s| s.flag).collect::<Vec<_>>(), ["--rows", "--widths", "--limit", "--on", "--mode"]);
        assert_eq!(Example::all_settings().len(), 5, "no nested configurations");
        assert_eq!(s.iter().map(|s| s.arity).collect::<Vec<_>>(), [Arity::Value, Arity::List, Arity::Optional, Arity::Switch, Arity::Optional]);
        assert_eq!((s[0].value_name, s[0].scope, s[0].service, s[0].env), ("N", Scope::Resumed, ServiceRole::Typed("rows"), None));
        assert_eq!(s[2].env, Some("RINGREC_EXAMPLE"));
        assert_eq!(s[0].help, " Rows.\n\n More words.\n");
        assert_eq!(s[0].summary(), "Rows.");
        assert_eq!(s[0].long(), "rows");
        assert!((s[0].check)("12").is_ok());
        assert_eq!((s[0].check)("-1").unwrap_err(), "`-1` is not a whole number >= 0");
        assert!((s[4].check)("auto").is_ok() && (s[4].check)("x").is_err());
    }

    #[test]
    fn values_are_set_and_shown_as_typed() {
        let mut e = Example::defaults();
        assert_eq!((e.show("rows").unwrap(), e.show("widths").unwrap(), e.show("limit").unwrap(), e.show("on").unwrap(), e.show("mode").unwrap()), ("5".into(), "2,3".into(), NOT_SET.into(), "false".into(), "auto".into()));
        assert!(e.set("rows", &["7"]).unwrap());
        assert!(e.set("widths", &["256", "128"]).unwrap());
        assert!(e.set("limit", &["0.5"]).unwrap());
        assert!(e.set("on", &[]).unwrap());
        assert!(e.set("mode", &["3"]).unwrap());
        assert_eq!(e, Example { rows: 7, widths: vec![256, 128], limit: Some(0.5), on: true, mode: Some(3) });
        assert_eq!((e.show("widths").unwrap(), e.show("limit").unwrap(), e.show("mode").unwrap()), ("256,128".into(), "0.5".into(), "3".into()));
        assert!(!e.set("nothing", &["1"]).unwrap());
        assert_eq!(e.show("nothing"), None);
        assert_eq!(e.set("rows", &["x"]).unwrap_err(), "`x` is not a whole number >= 0");
        assert_eq!(e.set("rows", &["1", "2"]).unwrap_err(), "expected one value, got 2");
    }
}
