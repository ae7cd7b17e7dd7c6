//! A small SQL-like expression language for `filter` and computed columns.
//!
//! Grammar: `or` / `and` / `not`, comparisons (`= == != <> < <= > >=`),
//! `IS [NOT] NULL`, arithmetic (`+ - * / %`), parentheses, column names,
//! numbers, `'single'` or `"double"` quoted strings, `true`, `false`, `null`.
//! NULL follows SQL: comparisons with NULL are NULL and `filter` keeps only
//! rows whose condition is true.

use crate::error::{Error, Result};
use crate::row::{Row, Value};
use std::cmp::Ordering;
use std::sync::Arc;

/// A parsed expression.
///
/// ```
/// use tidemark_types::expr::Expr;
/// use tidemark_types::row::{Row, Value};
/// let e = Expr::parse("amount >= 10 and not (id = 'x')").unwrap();
/// let row: Row = [("amount", Value::from(12.0)), ("id", Value::from("y"))].into_iter().collect();
/// assert_eq!(e.eval(&row), Value::Bool(true));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A constant.
    Literal(Value),
    /// A column reference.
    Column(Arc<str>),
    /// Logical negation.
    Not(Box<Expr>),
    /// Arithmetic negation.
    Negate(Box<Expr>),
    /// `expr IS NULL` (or `IS NOT NULL` when `negated`).
    IsNull {
        /// The tested expression.
        expr: Box<Expr>,
        /// `IS NOT NULL`.
        negated: bool,
    },
    /// A binary operation.
    Binary {
        /// The operator.
        op: BinaryOp,
        /// Left operand.
        left: Box<Expr>,
        /// Right operand.
        right: Box<Expr>,
    },
}

/// Binary operators, lowest precedence first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `or`, `||`
    Or,
    /// `and`, `&&`
    And,
    /// `=`, `==`
    Eq,
    /// `!=`, `<>`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Rem,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(String),
    Str(String),
    Ident(String),
    Op(&'static str),
    LParen,
    RParen,
}

fn tokenize(text: &str) -> std::result::Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_digit()
                    || chars[i] == '.'
                    || chars[i] == 'e'
                    || chars[i] == 'E')
            {
                i += 1;
            }
            tokens.push(Token::Number(chars[start..i].iter().collect()));
        } else if c == '\'' || c == '"' {
            let quote = c;
            i += 1;
            let mut s = String::new();
            loop {
                match chars.get(i) {
                    None => return Err(format!("unterminated string starting at character {}", i)),
                    Some(&ch) if ch == quote => {
                        // A doubled quote is an escaped quote, as in SQL.
                        if chars.get(i + 1) == Some(&quote) {
                            s.push(quote);
                            i += 2;
                        } else {
                            i += 1;
                            break;
                        }
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            tokens.push(Token::Str(s));
        } else if c.is_alphabetic() || c == '_' || c == '`' {
            if c == '`' {
                let start = i + 1;
                let end = chars[start..]
                    .iter()
                    .position(|&ch| ch == '`')
                    .ok_or("unterminated `quoted` column name")?;
                tokens.push(Token::Ident(chars[start..start + end].iter().collect()));
                i = start + end + 1;
            } else {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '.')
                {
                    i += 1;
                }
                tokens.push(Token::Ident(chars[start..i].iter().collect()));
            }
        } else if c == '(' {
            tokens.push(Token::LParen);
            i += 1;
        } else if c == ')' {
            tokens.push(Token::RParen);
            i += 1;
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let op = match two.as_str() {
                "==" => Some("="),
                "!=" | "<>" => Some("!="),
                "<=" => Some("<="),
                ">=" => Some(">="),
                "&&" => Some("and"),
                "||" => Some("or"),
                _ => None,
            };
            if let Some(op) = op {
                tokens.push(Token::Op(op));
                i += 2;
                continue;
            }
            let op = match c {
                '=' => "=",
                '<' => "<",
                '>' => ">",
                '+' => "+",
                '-' => "-",
                '*' => "*",
                '/' => "/",
                '%' => "%",
                '!' => "not",
                other => return Err(format!("unexpected character `{other}` at position {i}")),
            };
            tokens.push(Token::Op(op));
            i += 1;
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek_keyword(&self, kw: &str) -> bool {
        match self.tokens.get(self.pos) {
            Some(Token::Ident(s)) => s.eq_ignore_ascii_case(kw),
            Some(Token::Op(op)) => *op == kw,
            _ => false,
        }
    }

    fn eat_keyword(&mut self, kw: &str) -> bool {
        let hit = self.peek_keyword(kw);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn or(&mut self) -> std::result::Result<Expr, String> {
        let mut left = self.and()?;
        while self.eat_keyword("or") {
            let right = self.and()?;
            left = binary(BinaryOp::Or, left, right);
        }
        Ok(left)
    }

    fn and(&mut self) -> std::result::Result<Expr, String> {
        let mut left = self.not()?;
        while self.eat_keyword("and") {
            let right = self.not()?;
            left = binary(BinaryOp::And, left, right);
        }
        Ok(left)
    }

    fn not(&mut self) -> std::result::Result<Expr, String> {
        if self.eat_keyword("not") {
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> std::result::Result<Expr, String> {
        let left = self.additive()?;
        if self.eat_keyword("is") {
            let negated = self.eat_keyword("not");
            if !self.eat_keyword("null") {
                return Err("expected NULL after IS".into());
            }
            return Ok(Expr::IsNull {
                expr: Box::new(left),
                negated,
            });
        }
        let op = match self.tokens.get(self.pos) {
            Some(Token::Op("=")) => BinaryOp::Eq,
            Some(Token::Op("!=")) => BinaryOp::NotEq,
            Some(Token::Op("<")) => BinaryOp::Lt,
            Some(Token::Op("<=")) => BinaryOp::LtEq,
            Some(Token::Op(">")) => BinaryOp::Gt,
            Some(Token::Op(">=")) => BinaryOp::GtEq,
            _ => return Ok(left),
        };
        self.pos += 1;
        let right = self.additive()?;
        Ok(binary(op, left, right))
    }

    fn additive(&mut self) -> std::result::Result<Expr, String> {
        let mut left = self.multiplicative()?;
        loop {
            let op = match self.tokens.get(self.pos) {
                Some(Token::Op("+")) => BinaryOp::Add,
                Some(Token::Op("-")) => BinaryOp::Sub,
                _ => return Ok(left),
            };
            self.pos += 1;
            let right = self.multiplicative()?;
            left = binary(op, left, right);
        }
    }

    fn multiplicative(&mut self) -> std::result::Result<Expr, String> {
        let mut left = self.unary()?;
        loop {
            let op = match self.tokens.get(self.pos) {
                Some(Token::Op("*")) => BinaryOp::Mul,
                Some(Token::Op("/")) => BinaryOp::Div,
                Some(Token::Op("%")) => BinaryOp::Rem,
                _ => return Ok(left),
            };
            self.pos += 1;
            let right = self.unary()?;
            left = binary(op, left, right);
        }
    }

    fn unary(&mut self) -> std::result::Result<Expr, String> {
        if matches!(self.tokens.get(self.pos), Some(Token::Op("-"))) {
            self.pos += 1;
            return Ok(Expr::Negate(Box::new(self.unary()?)));
        }
        self.primary()
    }

    fn primary(&mut self) -> std::result::Result<Expr, String> {
        let token = self
            .tokens
            .get(self.pos)
            .cloned()
            .ok_or("unexpected end of expression")?;
        self.pos += 1;
        Ok(match token {
            Token::Number(n) => {
                if let Ok(i) = n.parse::<i64>() {
                    Expr::Literal(Value::Long(i))
                } else {
                    Expr::Literal(Value::Double(
                        n.parse().map_err(|_| format!("`{n}` is not a number"))?,
                    ))
                }
            }
            Token::Str(s) => Expr::Literal(Value::from(s.as_str())),
            Token::Ident(id) => match id.to_ascii_lowercase().as_str() {
                "true" => Expr::Literal(Value::Bool(true)),
                "false" => Expr::Literal(Value::Bool(false)),
                "null" => Expr::Literal(Value::Null),
                "and" | "or" | "not" | "is" => return Err(format!("unexpected keyword `{id}`")),
                _ => Expr::Column(Arc::from(id.as_str())),
            },
            Token::LParen => {
                let inner = self.or()?;
                if self.tokens.get(self.pos) != Some(&Token::RParen) {
                    return Err("missing `)`".into());
                }
                self.pos += 1;
                inner
            }
            Token::RParen => return Err("unexpected `)`".into()),
            Token::Op(op) => return Err(format!("unexpected `{op}`")),
        })
    }
}

fn binary(op: BinaryOp, left: Expr, right: Expr) -> Expr {
    Expr::Binary {
        op,
        left: Box::new(left),
        right: Box::new(right),
    }
}

impl Expr {
    /// Parses `text`, or says where it is wrong.
    pub fn parse(text: &str) -> Result<Expr> {
        let err = |reason: String| Error::Expression {
            expression: text.to_string(),
            reason,
        };
        let tokens = tokenize(text).map_err(err)?;
        if tokens.is_empty() {
            return Err(err("empty expression".into()));
        }
        let mut parser = Parser { tokens, pos: 0 };
        let expr = parser.or().map_err(err)?;
        if parser.pos != parser.tokens.len() {
            return Err(err(format!(
                "unexpected {:?} after a complete expression",
                parser.tokens[parser.pos]
            )));
        }
        Ok(expr)
    }

    /// The column names this expression reads.
    pub fn columns(&self) -> Vec<Arc<str>> {
        let mut out = Vec::new();
        self.collect_columns(&mut out);
        out
    }

    fn collect_columns(&self, out: &mut Vec<Arc<str>>) {
        match self {
            Expr::Literal(_) => {}
            Expr::Column(c) => {
                if !out.contains(c) {
                    out.push(c.clone())
                }
            }
            Expr::Not(e) | Expr::Negate(e) | Expr::IsNull { expr: e, .. } => e.collect_columns(out),
            Expr::Binary { left, right, .. } => {
                left.collect_columns(out);
                right.collect_columns(out);
            }
        }
    }

    /// Evaluates against `row`. Missing columns and type mismatches give
    /// NULL, as in SQL; division by zero gives NULL, as in Spark.
    pub fn eval(&self, row: &Row) -> Value {
        self.eval_in(row)
    }

    /// Whether `row` passes this condition (true, not false nor NULL).
    pub fn matches(&self, row: &Row) -> bool {
        self.matches_in(row)
    }

    /// [`Expr::eval`] over any [`Fields`]: a row, or one row of a
    /// columnar batch, with the same answer for the same values.
    pub fn eval_in<F: Fields + ?Sized>(&self, row: &F) -> Value {
        match self {
            Expr::Literal(v) => v.clone(),
            Expr::Column(c) => row.field(c),
            Expr::Not(e) => match e.eval_in(row) {
                Value::Bool(b) => Value::Bool(!b),
                _ => Value::Null,
            },
            Expr::Negate(e) => match e.eval_in(row) {
                Value::Long(v) => Value::Long(v.wrapping_neg()),
                Value::Double(v) => Value::Double(-v),
                _ => Value::Null,
            },
            Expr::IsNull { expr, negated } => Value::Bool(expr.eval_in(row).is_null() != *negated),
            Expr::Binary { op, left, right } => eval_binary(*op, left, right, row),
        }
    }

    /// [`Expr::matches`] over any [`Fields`].
    pub fn matches_in<F: Fields + ?Sized>(&self, row: &F) -> bool {
        matches!(self.eval_in(row), Value::Bool(true))
    }
}

/// Where an expression reads column values: a [`Row`], or one row of a
/// columnar batch (`columns::ColumnsRow`).
pub trait Fields {
    /// The value of column `name`; NULL when there is no such column.
    fn field(&self, name: &str) -> Value;
}

impl Fields for Row {
    fn field(&self, name: &str) -> Value {
        self.get(name).cloned().unwrap_or(Value::Null)
    }
}

fn eval_binary<F: Fields + ?Sized>(op: BinaryOp, left: &Expr, right: &Expr, row: &F) -> Value {
    match op {
        BinaryOp::And => {
            let l = left.eval_in(row);
            if l == Value::Bool(false) {
                return l;
            }
            match (l, right.eval_in(row)) {
                (_, Value::Bool(false)) => Value::Bool(false),
                (Value::Bool(true), Value::Bool(true)) => Value::Bool(true),
                _ => Value::Null,
            }
        }
        BinaryOp::Or => {
            let l = left.eval_in(row);
            if l == Value::Bool(true) {
                return l;
            }
            match (l, right.eval_in(row)) {
                (_, Value::Bool(true)) => Value::Bool(true),
                (Value::Bool(false), Value::Bool(false)) => Value::Bool(false),
                _ => Value::Null,
            }
        }
        BinaryOp::Eq
        | BinaryOp::NotEq
        | BinaryOp::Lt
        | BinaryOp::LtEq
        | BinaryOp::Gt
        | BinaryOp::GtEq => {
            let (l, r) = (left.eval_in(row), right.eval_in(row));
            let ordering = match compare_with_coercion(&l, &r) {
                Some(o) => o,
                None => return Value::Null,
            };
            Value::Bool(match op {
                BinaryOp::Eq => ordering == Ordering::Equal,
                BinaryOp::NotEq => ordering != Ordering::Equal,
                BinaryOp::Lt => ordering == Ordering::Less,
                BinaryOp::LtEq => ordering != Ordering::Greater,
                BinaryOp::Gt => ordering == Ordering::Greater,
                _ => ordering != Ordering::Less,
            })
        }
        _ => arithmetic(op, left.eval_in(row), right.eval_in(row)),
    }
}

/// Compares, letting a timestamp column meet an RFC 3339 string literal.
fn compare_with_coercion(l: &Value, r: &Value) -> Option<Ordering> {
    match (l, r) {
        (Value::Timestamp(t), Value::Str(s)) => crate::time::parse_rfc3339(s).map(|u| t.cmp(&u)),
        (Value::Str(s), Value::Timestamp(t)) => crate::time::parse_rfc3339(s).map(|u| u.cmp(t)),
        _ => l.sql_cmp(r),
    }
}

fn arithmetic(op: BinaryOp, l: Value, r: Value) -> Value {
    if let (Value::Long(a), Value::Long(b)) = (&l, &r) {
        let (a, b) = (*a, *b);
        return match op {
            BinaryOp::Add => Value::Long(a.wrapping_add(b)),
            BinaryOp::Sub => Value::Long(a.wrapping_sub(b)),
            BinaryOp::Mul => Value::Long(a.wrapping_mul(b)),
            // Spark's `/` is always fractional division.
            BinaryOp::Div if b != 0 => Value::Double(a as f64 / b as f64),
            BinaryOp::Rem if b != 0 => Value::Long(a.wrapping_rem(b)),
            _ => Value::Null,
        };
    }
    let (Some(a), Some(b)) = (l.as_f64(), r.as_f64()) else {
        return Value::Null;
    };
    if matches!(l, Value::Timestamp(_)) || matches!(r, Value::Timestamp(_)) {
        return Value::Null;
    }
    match op {
        BinaryOp::Add => Value::Double(a + b),
        BinaryOp::Sub => Value::Double(a - b),
        BinaryOp::Mul => Value::Double(a * b),
        BinaryOp::Div if b != 0.0 => Value::Double(a / b),
        BinaryOp::Rem if b != 0.0 => Value::Double(a % b),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What generated expressions are made of: every operator and keyword,
    /// the test row's columns, and the numbers at the edges of the types.
    const TOKENS: &[&str] = &[
        "n",
        "amount",
        "id",
        "missing_value",
        "nope",
        "0",
        "1",
        "-1",
        "2.5",
        "0.0",
        "9223372036854775807",
        "-9223372036854775808",
        "1e308",
        "-1e308",
        "'x'",
        "''",
        "'%a_'",
        "(",
        ")",
        "(",
        ")",
        "+",
        "-",
        "*",
        "/",
        "%",
        "=",
        "==",
        "!=",
        "<>",
        "<",
        "<=",
        ">",
        ">=",
        "AND",
        "OR",
        "NOT",
        "IS",
        "NULL",
        "TRUE",
        "FALSE",
        "IN",
        "LIKE",
        "BETWEEN",
        "CASE",
        "WHEN",
        "THEN",
        "ELSE",
        "END",
        ",",
        "CAST",
        "AS",
        "BIGINT",
        "DOUBLE",
        "STRING",
        "TIMESTAMP",
        "coalesce",
        "abs",
        "length",
        "lower",
        "upper",
        "substring",
        "concat",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Any sequence of expression tokens parses or is refused, and what
        /// parses evaluates, without a panic (#15: no input may crash the
        /// process; filters and projections are user input).
        #[test]
        fn no_token_sequence_panics_the_parser_or_the_evaluator(
            tokens in proptest::collection::vec(proptest::sample::select(TOKENS), 0..24)
        ) {
            if let Ok(expr) = Expr::parse(&tokens.join(" ")) {
                let _ = expr.eval(&row());
            }
        }

        /// Any text at all, likewise.
        #[test]
        fn no_text_panics_the_parser_or_the_evaluator(text in "\\PC{0,64}") {
            if let Ok(expr) = Expr::parse(&text) {
                let _ = expr.eval(&row());
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4000))]
        /// Over rows whose columns keep their types (as a columnar batch's
        /// do), an expression's values share one type, NULLs aside: what
        /// lets a computed column run on columns (`columns::array_of`).
        #[test]
        fn over_typed_columns_an_expression_gives_values_of_one_type(
            text in expression_text(),
            rows in proptest::collection::vec(
                (
                    proptest::option::of(-1e6f64..1e6),
                    proptest::option::of(proptest::prelude::any::<i64>()),
                    proptest::option::of("[a-z']{0,3}"),
                ),
                1..12,
            ),
        ) {
            if let Ok(expr) = Expr::parse(&text) {
                let kinds: std::collections::HashSet<std::mem::Discriminant<Value>> = rows
                    .iter()
                    .map(|(amount, n, id)| {
                        let row: Row = [
                            ("amount", amount.map_or(Value::Null, Value::from)),
                            ("n", n.map_or(Value::Null, Value::from)),
                            ("id", id.as_deref().map_or(Value::Null, Value::from)),
                            ("missing_value", Value::Null),
                        ]
                        .into_iter()
                        .collect();
                        expr.eval(&row)
                    })
                    .filter(|v| !v.is_null())
                    .map(|v| std::mem::discriminant(&v))
                    .collect();
                proptest::prop_assert!(kinds.len() <= 1, "{}", text);
            }
        }
    }

    /// Expressions built by the grammar: columns of every type, literals,
    /// every operator, nested.
    fn expression_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let leaf = proptest::sample::select(vec![
            "amount",
            "n",
            "id",
            "missing_value",
            "1",
            "0",
            "-1",
            "2.5",
            "'x'",
            "null",
            "true",
        ])
        .prop_map(String::from);
        let ops = vec![
            "+", "-", "*", "/", "%", "=", "!=", "<", "<=", ">", ">=", "and", "or",
        ];
        leaf.prop_recursive(3, 16, 2, move |inner| {
            prop_oneof![
                (
                    inner.clone(),
                    proptest::sample::select(ops.clone()),
                    inner.clone()
                )
                    .prop_map(|(l, op, r)| format!("({l} {op} {r})")),
                inner.clone().prop_map(|e| format!("not ({e})")),
                inner.clone().prop_map(|e| format!("-({e})")),
                inner.prop_map(|e| format!("({e}) is null")),
            ]
        })
    }

    fn row() -> Row {
        [
            ("amount", Value::from(12.5)),
            ("n", Value::from(3i64)),
            ("id", Value::from("a'b")),
            ("missing_value", Value::Null),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn evaluates_comparisons_and_logic() {
        let r = row();
        for (text, expected) in [
            ("amount >= 12.5", true),
            ("amount > 12.5", false),
            ("n = 3 and amount < 20", true),
            ("n != 3 or id = 'a''b'", true),
            ("not (n = 3)", false),
            ("n * 2 + 1 = 7", true),
            ("n / 2 = 1.5", true),
            ("missing_value is null", true),
            ("id is not null && n == 3", true),
            ("-n < 0", true),
        ] {
            assert_eq!(Expr::parse(text).unwrap().matches(&r), expected, "{text}");
        }
    }

    #[test]
    fn null_is_not_true() {
        let r = row();
        assert!(!Expr::parse("missing_value > 1").unwrap().matches(&r));
        assert!(!Expr::parse("not (missing_value > 1)").unwrap().matches(&r));
        assert!(Expr::parse("missing_value > 1 or n = 3")
            .unwrap()
            .matches(&r));
    }

    #[test]
    fn reports_syntax_errors() {
        for text in ["amount >", "(a = 1", "a = 'x", "a ? b", "", "a = 1 b"] {
            assert!(Expr::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn lists_columns() {
        let e = Expr::parse("a > 1 and (b = 'x' or a < c)").unwrap();
        let cols: Vec<String> = e.columns().iter().map(|c| c.to_string()).collect();
        assert_eq!(cols, ["a", "b", "c"]);
    }
}
